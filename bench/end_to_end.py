"""End to end at N = 1000: convalue's validation and solve against CVXPY + OSQP and scikit-learn, in one process.

bench/solvers.py's problem (clustered unit-norm gradients, p = 4096, seed 0) at its two gammas (5e-2 and 5e-4, given as
bench/solvers.py gives them; max|beta| is about 0.63 here), interleaved over --rounds so that this shared host's drift
favours no version:
- convalue: solve_kmm(K, beta, formed=True, rank_bound=p), as the engine calls it on the K it formed as G G^T
  (validation checks what construction cannot guarantee, then the solve); its two parts are timed apart too
  (make_problem, solve_problem);
- convalue, K from outside: solve_kmm(K, beta, rank_bound=p), the full check (a Cholesky factor certifies PSD-ness
  and gives the rank) before the same solve;
- CVXPY + OSQP as the paper calls it (its own checks included), on the validated problem;
- scikit-learn's enet_path on the precomputed Gram (up to 1,000 sweeps: bench/baselines.py).
Every version's time is its best of --repeat calls per round (CVXPY: one call per round); the ratios are of the
best times over all rounds; the medians of the per-round bests and the best CPU times (this process's, steadier on
a loaded host) are printed beside them. Every convalue answer is certified
(KKT at round-off) and its objective checked against CVXPY's. Prints the ratios against the targets (end to end
>= 100x CVXPY and faster than enet_path) and ends with one JSON line.

    .venv/bin/python bench/end_to_end.py                   # about a minute
    .venv/bin/python bench/end_to_end.py --rounds 9 --n 2000
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
from baselines import sklearn_lasso  # bench/baselines.py, beside this script
from synthetic import clustered_gradients
from timing import interleaved

from convalue.solvers import kkt_violation, make_problem, solve_kmm, solve_problem

VERSIONS = ("convalue", "validate", "solve", "convalue_outside", "cvxpy", "enet_path")


def timed(fn, repeat: int) -> tuple[float, float, object]:
    """(best wall seconds, best CPU seconds of this process, the last result) of fn() over `repeat` calls: on a
    loaded host the CPU time is the steadier measure of the work (every version here runs on one thread)."""
    wall, cpu, out = float("inf"), float("inf"), None
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        out = fn()
        cpu = min(cpu, time.process_time() - c0)
        wall = min(wall, time.perf_counter() - t0)
    return wall, cpu, out


def versions(K: np.ndarray, beta: np.ndarray, G: np.ndarray, g: np.ndarray, gamma: float, prob, p: int) -> dict:
    """Each version's call on this gamma's problem (prob: the validated one, for the solve and CVXPY)."""
    return {
        "convalue": lambda: solve_kmm(K, beta, gamma=gamma, rank_bound=p, formed=True),
        "validate": lambda: make_problem(K, beta, gamma=gamma, rank_bound=p, formed=True),
        "solve": lambda: solve_problem(prob),
        "convalue_outside": lambda: solve_kmm(K, beta, gamma=gamma, rank_bound=p),
        "cvxpy": lambda: solve_problem(prob, method="cvxpy_paper"),
        "enet_path": lambda: sklearn_lasso(G, g, K, beta, gamma, 1000),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--p", type=int, default=4096)
    ap.add_argument("--gammas", type=float, nargs="+", default=[5e-2, 5e-4],
                    help="gamma itself, as bench/solvers.py gives it (max|beta| is about 0.63 on this data)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=5, help="calls per round of each convalue version and enet_path")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    G, g32 = clustered_gradients(args.n, args.p, seed=args.seed)
    g = g32.astype(np.float64)
    K, beta = G @ G.T, G @ g  # numpy's G @ G.T is exactly symmetric, as the engine's self_gram is
    beta_max = float(np.abs(beta).max())
    scale = max(1.0, beta_max)
    warm = make_problem(K[:8, :8], beta[:8], gamma=0.1 * beta_max)
    solve_problem(warm, method="cvxpy_paper")  # imports out of the timings
    sklearn_lasso(G[:8], g, np.ascontiguousarray(K[:8, :8]), beta[:8], 0.1 * beta_max, 10)
    results = []
    print(f"N = {args.n}, p = {args.p}; best of {args.repeat} per round, {args.rounds} rounds", flush=True)
    for gamma in args.gammas:
        prob = make_problem(K, beta, gamma=gamma, rank_bound=args.p, formed=True)
        calls = versions(K, beta, G, g, gamma, prob, args.p)
        times: dict[str, list[float]] = {v: [] for v in VERSIONS}
        cpu: dict[str, list[float]] = {v: [] for v in VERSIONS}
        out: dict[str, object] = {}
        for _, version in interleaved(args.rounds, VERSIONS):
            t, c, out[version] = timed(calls[version], repeat=1 if version == "cvxpy" else args.repeat)
            times[version].append(t)
            cpu[version].append(c)
        ref = out["cvxpy"]
        for version in ("convalue", "convalue_outside"):
            sol = out[version]
            assert sol.status == "optimal" and sol.kkt <= 1e-10 * scale, (version, sol.kkt)
            assert abs(sol.objective - ref.objective) <= 1e-9 * max(1.0, abs(ref.objective)), version
        w_sk, converged = out["enet_path"]
        best = {v: min(ts) for v, ts in times.items()}
        median = {v: statistics.median(ts) for v, ts in times.items()}
        best_cpu = {v: min(ts) for v, ts in cpu.items()}
        rec = {"N": args.n, "gamma": gamma, "ratio": gamma / beta_max, "nnz": int(np.count_nonzero(out["convalue"].w)),
               "step": out["convalue"].info.get("step"), "kkt": out["convalue"].kkt,
               "checks": out["validate"].checks, "best_s": best, "median_s": median, "best_cpu_s": best_cpu,
               "enet_path_converged": bool(converged),
               "enet_path_kkt": kkt_violation(prob, w_sk) / scale,
               "vs_cvxpy": round(best["cvxpy"] / best["convalue"], 1),
               "vs_cvxpy_median": round(median["cvxpy"] / median["convalue"], 1),
               "vs_cvxpy_cpu": round(best_cpu["cvxpy"] / best_cpu["convalue"], 1),
               "vs_cvxpy_outside": round(best["cvxpy"] / best["convalue_outside"], 1),
               "vs_enet_path": round(best["enet_path"] / best["convalue"], 2),
               "vs_enet_path_median": round(median["enet_path"] / median["convalue"], 2),
               "vs_enet_path_cpu": round(best_cpu["enet_path"] / best_cpu["convalue"], 2),
               "vs_enet_path_outside": round(best["enet_path"] / best["convalue_outside"], 2),
               "validate_over_solve": round(best["validate"] / best["solve"], 2)}
        results.append(rec)
        print(f"\ngamma = {gamma:g} ({rec['ratio']:.3g} max|beta|; {rec['nnz']} active, step {rec['step']}, KKT {rec['kkt']:.1e}, "
              f"validation {rec['checks']['psd']})")
        for v in VERSIONS:
            print(f"  {v:<17} {best[v] * 1e3:9.3f} ms  (median {median[v] * 1e3:9.3f} ms, CPU {best_cpu[v] * 1e3:9.3f} ms)")
        print(f"  end to end: {rec['vs_cvxpy']}x CVXPY (medians {rec['vs_cvxpy_median']}x, CPU {rec['vs_cvxpy_cpu']}x) "
              f"[target >= 100x], {rec['vs_enet_path']}x enet_path (medians {rec['vs_enet_path_median']}x, CPU "
              f"{rec['vs_enet_path_cpu']}x) [target > 1x]; validation / solve {rec['validate_over_solve']}")
        print(f"  K from outside: {rec['vs_cvxpy_outside']}x CVXPY, {rec['vs_enet_path_outside']}x enet_path "
              f"(enet_path {'converged' if converged else 'NOT converged'})", flush=True)
    print(json.dumps({"bench": "end_to_end", "p": args.p, "seed": args.seed, "rounds": args.rounds,
                      "repeat": args.repeat, "results": results}, default=float))


if __name__ == "__main__":
    main()
