"""Rank-deficient K (N > p): the homotopy against the active-set chain it replaced there, CVXPY + OSQP and scikit-learn.

Clustered synthetic unit-norm gradients (bench/synthetic.py) with fewer dimensions p than candidates N, so
K = G G^T has rank p, at the paper's two gammas. In one process, per case:
  convalue        solve_problem on the validated problem (make_problem records rank(K): the LARS homotopy, after
                  the working-set homotopy for sparse solutions of many candidates), best of --repeats
  homotopy first  where convalue took the working set: the same solve with the full homotopy first, as before,
                  interleaved with convalue's runs, best of --repeats
  former chain    the same solver given K without its rank (the ADMM / PDAS chain that ran here before),
                  capped at --cap seconds
  cvxpy+osqp      the paper's call (N <= --cvxpy-max-n); CVXPY's own PSD check rejects a singular K as not
                  DCP, and then the reference's psd_wrap setting (convalue.solvers.reference "tight") runs instead
  sklearn         coordinate descent on the precomputed Gram (Lasso with X = G^T, alpha = gamma / p), at its
                  default tolerance (up to 1,000 sweeps), which stops short of KKT 1e-6 here
  sklearn tight   the same at the loosest tolerance in 1e-6 ... 1e-10 whose solution has KKT <= 1e-6 (up to
                  100,000 sweeps): scikit-learn at convalue's accuracy target; the time is that one run's
Prints time, KKT violation, objective and support size per method, the ratios, and ends with one JSON line.
Per case up to N = --path-max-n it also times kmm_path on --path-points gammas (one homotopy path read at
every point) against one homotopy per point, as kmm_path ran before.

    .venv/bin/python bench/rank_deficient.py [--cases 300x100 1000x300 3000x500] [--cap 30]
    .venv/bin/python bench/rank_deficient.py --scan     # the working set first or the homotopy first, and the rule
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import sys
import time
from pathlib import Path

import numpy as np

# the repository root first (bench/solvers.py is named like the package), bench/ last
sys.path[0] = str(Path(__file__).resolve().parents[1])
sys.path.append(str(Path(__file__).resolve().parent))

from baselines import sklearn_lasso  # noqa: E402
from synthetic import case, clustered_gram  # noqa: E402

import convalue.solvers.penalised  # noqa: E402
from convalue.solvers import kkt_violation, kmm_path, make_problem, solve_problem  # noqa: E402
from convalue.solvers.operators import GramOperator  # noqa: E402
from convalue.solvers.penalised import prefers_working_set, solve_penalised  # noqa: E402
from convalue.solvers.threads import blas_threads  # noqa: E402

TIGHT_TOLS = (1e-6, 1e-7, 1e-8, 1e-9, 1e-10)  # scikit-learn's duality-gap tolerances, loosest first


@contextlib.contextmanager
def working_set_first(always: bool):
    """Inside: on affordable rank-deficient K the working set goes first for every gamma and N (always) or never."""
    module = convalue.solvers.penalised
    saved = module.WORKING_SET_FIRST_MIN_N, module.WORKING_SET_FIRST_RATIO
    module.WORKING_SET_FIRST_MIN_N, module.WORKING_SET_FIRST_RATIO = (0, 0.0) if always else (float("inf"), 0.0)
    try:
        yield
    finally:
        module.WORKING_SET_FIRST_MIN_N, module.WORKING_SET_FIRST_RATIO = saved


def homotopy_first(prob):
    """solve_problem with the full homotopy first at every size (the working set never goes before it)."""
    with working_set_first(False):
        return solve_problem(prob)


def scan(cases: list[tuple[int, int]], ratios: list[float], repeats: int, seed: int) -> list[dict]:
    """The working set first against the full homotopy first on every case and gamma = ratio * max|beta|, both
    through solve_penalised and certified, interleaved, best of `repeats`: the evidence for the rule
    (WORKING_SET_FIRST_MIN_N, WORKING_SET_FIRST_RATIO) that picks between them."""
    print(f"{'N':>6} {'p':>5} {'ratio':>6} {'homotopy_s':>11} {'working_s':>10} {'speedup':>8}  rule picks")
    rows = []
    for n, p in cases:
        K, beta, _, _ = clustered_gram(n, p, seed=seed)
        op = GramOperator(K, beta, rank=p)
        gmax = float(np.abs(op.beta).max())
        for ratio in ratios:
            best = {True: float("inf"), False: float("inf")}
            for _ in range(repeats):
                for always in (False, True):
                    with working_set_first(always), blas_threads(n):
                        t0 = time.perf_counter()
                        w, info = solve_penalised(op, ratio * gmax)
                        best[always] = min(best[always], time.perf_counter() - t0)
                    if not info["converged"]:
                        raise RuntimeError(f"{n}x{p} at {ratio} max|beta|: not converged ({info})")
            picks = prefers_working_set(n, ratio * gmax, gmax)
            rows.append({"N": n, "p": p, "ratio": ratio, "homotopy_s": round(best[False], 4),
                         "working_set_s": round(best[True], 4), "speedup": round(best[False] / best[True], 2),
                         "rule_picks_working_set": picks})
            print(f"{n:>6} {p:>5} {ratio:>6g} {best[False]:>11.4f} {best[True]:>10.4f} "
                  f"{best[False] / best[True]:>7.2f}x  {'working set' if picks else 'homotopy'}", flush=True)
    for picks in (True, False):
        s = [r["speedup"] for r in rows if r["rule_picks_working_set"] == picks]
        if s:
            print(f"where the rule picks the {'working set' if picks else 'homotopy'}: working set first is "
                  f"{np.exp(np.log(s).mean()):.2f}x (geometric mean) of {len(s)}, from {min(s):.2f}x to {max(s):.2f}x")
    return rows


def deficient_case(text: str) -> tuple[int, int]:
    """'NxP' -> (N, p) with p < N (K of rank p)."""
    n, p = case(text)
    if p >= n:
        raise argparse.ArgumentTypeError(f"a case is NxP with 0 < P < N, got {text!r}")
    return n, p


def report(prob, head: str, name: str, t: float, w: np.ndarray, note: str = "") -> tuple[float, float]:
    """Print one method's line for the case `head`; (KKT violation, objective) of w."""
    kkt, obj = kkt_violation(prob, w), prob.objective(w)
    print(f"{head} {name:<14} {t:>9.4f} {kkt:>9.1e} {obj:>14.9f} {int(np.count_nonzero(w)):>5}  {note}", flush=True)
    return kkt, obj


def time_paths(K: np.ndarray, beta: np.ndarray, points: int, head: str) -> dict:
    """kmm_path's grid from one homotopy path against one homotopy per grid point; both certified."""
    path = kmm_path(K, beta, n_gammas=points)
    prob = make_problem(K, beta, gamma=0.0)
    op = GramOperator(prob.K, prob.beta, rank=prob.rank)  # clustered data: no duplicates to drop here
    t0 = time.perf_counter()
    ws = [solve_penalised(op, float(g))[0] for g in path.gammas]
    per_point = time.perf_counter() - t0
    kkts = [kkt_violation(make_problem(K, beta, gamma=float(g), check_psd=False), w) for g, w in zip(path.gammas, ws)]
    print(f"{head} {'':>7} {'kmm_path':<14} {path.time_s:>9.4f} {path.kkt.max():>9.1e}  {points} gammas from one "
          f"path; one homotopy per gamma {per_point:.3f} s (KKT <= {max(kkts):.1e}): {per_point / path.time_s:.1f}x",
          flush=True)
    return {"points": points, "path_s": round(path.time_s, 4), "path_kkt": float(path.kkt.max()),
            "per_point_s": round(per_point, 4), "per_point_kkt": max(kkts),
            "speedup": round(per_point / path.time_s, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=deficient_case, nargs="+", default=[(300, 100), (1000, 300), (3000, 500)])
    ap.add_argument("--gammas", type=float, nargs="+", default=[5e-2, 5e-4])
    ap.add_argument("--cap", type=float, default=30.0, help="seconds allowed to the former chain per solve")
    ap.add_argument("--cvxpy-max-n", type=int, default=1000)
    ap.add_argument("--path-points", type=int, default=50)
    ap.add_argument("--path-max-n", type=int, default=1000, help="largest N whose kmm_path is timed")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=3, help="convalue's solve (and the homotopy-first one): best of")
    ap.add_argument("--scan", action="store_true",
                    help="instead: the working set first against the homotopy first on --scan-cases x --scan-ratios")
    ap.add_argument("--scan-cases", type=deficient_case, nargs="+",
                    default=[(300, 100), (1000, 100), (1000, 300), (2000, 300), (3000, 500), (4000, 700)])
    ap.add_argument("--scan-ratios", type=float, nargs="+", default=[0.2, 0.1, 0.05, 0.03, 0.01],
                    help="gamma / max|beta|")
    args = ap.parse_args()
    if args.scan:
        rows = scan(args.scan_cases, args.scan_ratios, args.repeats, args.seed)
        print(json.dumps({"bench": "rank_deficient_scan", "results": rows}))
        return

    warm = np.random.default_rng(0).standard_normal((8, 4))  # imports (scikit-learn's LARS, CVXPY) out of the timings
    solve_problem(make_problem(warm @ warm.T, warm @ warm[0], gamma=0.1))
    solve_problem(make_problem(warm @ warm.T, warm @ warm[0], gamma=0.1), method="cvxpy_paper")
    sklearn_lasso(warm, warm[0], warm @ warm.T, warm @ warm[0], 0.1, 10)
    rows, paths = [], []
    print(f"{'N':>6} {'p':>5} {'gamma':>7} {'method':<14} {'time_s':>9} {'kkt':>9} {'objective':>14} {'nnz':>5}  note")
    for n, p in args.cases:
        K, beta, G, g = clustered_gram(n, p, seed=args.seed)
        for gamma in args.gammas:
            t0 = time.perf_counter()
            prob = make_problem(K, beta, gamma=gamma)
            rec = {"N": n, "p": p, "gamma": gamma, "rank": prob.rank, "validate_s": round(time.perf_counter() - t0, 3)}
            line = functools.partial(report, prob, f"{n:>6} {p:>5} {gamma:>7.0e}")

            times: dict[str, list[float]] = {"convalue": [], "homotopy first": []}
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                sol = solve_problem(prob)
                times["convalue"].append(time.perf_counter() - t0)
                if sol.info["strategy"] != "homotopy":
                    t0 = time.perf_counter()
                    old = homotopy_first(prob)
                    times["homotopy first"].append(time.perf_counter() - t0)
            t_cv = min(times["convalue"])
            kkt, obj = line("convalue", t_cv, sol.w, f"strategy={sol.info['strategy']}, rank {prob.rank}")
            rec |= {"convalue_s": round(t_cv, 4), "convalue_kkt": kkt, "convalue_obj": obj,
                    "convalue_nnz": int(np.count_nonzero(sol.w)), "convalue_strategy": sol.info["strategy"]}
            if times["homotopy first"]:
                t_h = min(times["homotopy first"])
                kkt, obj = line("homotopy first", t_h, old.w, f"strategy={old.info['strategy']}; "
                                f"convalue is {t_h / t_cv:.1f}x faster")
                rec |= {"homotopy_first_s": round(t_h, 4), "homotopy_first_kkt": kkt, "homotopy_first_obj": obj,
                        "speedup_vs_homotopy_first": round(t_h / t_cv, 1)}

            t0 = time.perf_counter()
            w_old, info = solve_penalised(GramOperator(prob.K, prob.beta), gamma, max_seconds=args.cap)
            t_old = time.perf_counter() - t0
            kkt, obj = line("former chain", t_old, w_old,
                            f"strategy={info['strategy']}, fallback={info['fallback']}, "
                            f"{'converged' if info['converged'] else 'NOT converged'}; "
                            f"convalue is {t_old / t_cv:.1f}x faster")
            rec |= {"former_s": round(t_old, 4), "former_kkt": kkt, "former_obj": obj,
                    "former_converged": bool(info["converged"]), "speedup_vs_former": round(t_old / t_cv, 1)}

            if n <= args.cvxpy_max_n:
                import cvxpy as cp

                setting = "cvxpy_paper"
                t0 = time.perf_counter()
                try:
                    ref = solve_problem(prob, method=setting)
                except cp.error.DCPError:  # quad_form's eigen-check finds K's round-off negative eigenvalues
                    setting = "cvxpy"
                    print(f"{n:>6} {p:>5} {gamma:>7.0e} {'cvxpy+osqp':<14} the paper's call rejects K as not DCP "
                          "(singular K); timing the psd_wrap setting instead", flush=True)
                    t0 = time.perf_counter()
                    ref = solve_problem(prob, method=setting)
                t_cx = time.perf_counter() - t0
                kkt, obj = line("cvxpy+osqp", t_cx, ref.w, f"{setting}; convalue is {t_cx / t_cv:.1f}x faster")
                rec |= {"cvxpy_setting": setting, "cvxpy_s": round(t_cx, 4), "cvxpy_kkt": kkt, "cvxpy_obj": obj,
                        "speedup_vs_cvxpy": round(t_cx / t_cv, 1)}

            t0 = time.perf_counter()
            w_sk, conv = sklearn_lasso(G, g, prob.K, prob.beta, gamma, max_iter=1000)
            t_sk = time.perf_counter() - t0
            kkt, obj = line("sklearn", t_sk, w_sk, f"{'converged' if conv else 'NOT converged (1000 sweeps)'}; "
                            f"convalue is {t_sk / t_cv:.1f}x faster")
            rec |= {"sklearn_s": round(t_sk, 4), "sklearn_kkt": kkt, "sklearn_obj": obj, "sklearn_converged": conv,
                    "speedup_vs_sklearn": round(t_sk / t_cv, 1)}
            for tol in TIGHT_TOLS:
                t0 = time.perf_counter()
                w_sk, conv = sklearn_lasso(G, g, prob.K, prob.beta, gamma, max_iter=100_000, tol=tol)
                t_sk = time.perf_counter() - t0
                certified = kkt_violation(prob, w_sk) <= 1e-6
                if certified:
                    break
            kkt, obj = line("sklearn tight", t_sk, w_sk, f"tol {tol:g}; convalue is {t_sk / t_cv:.1f}x faster"
                            + ("" if certified else "; KKT still above 1e-6 at the tightest tolerance"))
            rec |= {"sklearn_tight_tol": tol, "sklearn_tight_s": round(t_sk, 4), "sklearn_tight_kkt": kkt,
                    "speedup_vs_sklearn_tight": round(t_sk / t_cv, 1)}
            rows.append(rec)
        if n <= args.path_max_n:
            paths.append(time_paths(K, beta, args.path_points, f"{n:>6} {p:>5}"))
    print(json.dumps({"bench": "rank_deficient", "cap_s": args.cap, "results": rows, "paths": paths}, default=float))


if __name__ == "__main__":
    main()
