"""One or two BLAS threads for the active-set solve at N = 1000, gamma = 5e-4, and where its time goes.

On the clustered problem of bench/solvers.py (p = 4096, seed 0), in one process:
(1) spotrf alone in a tight loop, at N and at the solution's support size, one thread against two, and torch's
    Cholesky (MKL on x86 wheels; the library alternative) at N on one thread;
(2) the whole solve on one thread against two threads inside spotrf only (every other call stays on one),
    interleaved, best and median of --repeats solves each, with every spotrf call's time inside the solve;
(3) a cProfile of the one-thread solve: milliseconds per solve of the costliest functions;
(4) the solve against its skeleton: the same LAPACK and BLAS calls as one solve makes (counted by spies on
    the triangular solves and products of K), on the same matrices, with none of the solver's logic,
    interleaved, one thread: how far the solve is above the cost of the linear algebra it needs.
Prints the figures and ends with one JSON line.

    .venv/bin/python bench/blas_threads.py [--n 1000 --gamma 5e-4 --repeats 30]
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import sys
import time
from pathlib import Path

import numpy as np
import scipy.linalg as sla
import torch

# this folder holds convalue.solvers.py, named like the `solvers` package: the repository root goes first
sys.path[0] = str(Path(__file__).resolve().parents[1])
sys.path.append(str(Path(__file__).resolve().parent))

from synthetic import clustered_gram  # noqa: E402

import convalue.solvers.kkt  # noqa: E402
import convalue.solvers.linalg  # noqa: E402
import convalue.solvers.operators  # noqa: E402
from convalue.solvers import make_problem, solve_problem  # noqa: E402
from convalue.solvers.threads import threadpools  # noqa: E402


def stats_ms(ts: list[float]) -> dict[str, float]:
    """min, median and max of `ts` seconds, in milliseconds."""
    a = 1e3 * np.asarray(ts)
    return {"min": round(float(a.min()), 2), "median": round(float(np.median(a)), 2), "max": round(float(a.max()), 2)}


def count_calls(prob, tol: float | None = None) -> dict[str, int]:
    """Triangular-solve pairs with the N x N factor and with the support's, and products of K, in one solve (at
    tol: see convalue.solvers.solve_kmm)."""
    counts = {"pairs_n": 0, "pairs_support": 0, "products": 0}
    n = prob.K.shape[0]
    originals = {(convalue.solvers.linalg, "cholesky_solve"): convalue.solvers.linalg.cholesky_solve,
                 (convalue.solvers.operators, "cholesky_solve"): convalue.solvers.operators.cholesky_solve,
                 (convalue.solvers.operators, "gram_times"): convalue.solvers.operators.gram_times,
                 (convalue.solvers.kkt, "gram_times"): convalue.solvers.kkt.gram_times}

    def pair(c, b):
        counts["pairs_n" if c.shape[0] == n else "pairs_support"] += 1
        return originals[(convalue.solvers.linalg, "cholesky_solve")](c, b)

    def product(K, w):
        counts["products"] += 1
        return originals[(convalue.solvers.operators, "gram_times")](K, w)

    convalue.solvers.linalg.cholesky_solve = convalue.solvers.operators.cholesky_solve = pair
    convalue.solvers.operators.gram_times = convalue.solvers.kkt.gram_times = product
    try:
        solve_problem(prob, method="active_set", tol=tol)
    finally:
        for (module, name), fn in originals.items():
            setattr(module, name, fn)
    return counts


def skeleton(K: np.ndarray, beta: np.ndarray, support: np.ndarray | None, counts: dict[str, int],
             rho: float) -> None:
    """The linear algebra of one ADMM + polish solve and nothing else: float32 copy, two factorisations,
    the counted triangular-solve pairs and products, the support gather (a lower bound on the ADMM path, the
    one N = 1000, gamma = 5e-4 takes; supports under convalue.solvers.linalg.MIXED_MIN_N factor in float64 instead).
    support None: ADMM stopped early (no polish), K cast straight into the factor's buffer, as it then is."""
    strtrs, spotrf = sla.lapack.strtrs, sla.lapack.spotrf
    if support is None:
        shifted = K.astype(np.float32)
    else:
        K32 = K.astype(np.float32)  # cast once and copied for the shift, as GramOperator does
        shifted = K32.copy()
    shifted[np.diag_indices(K.shape[0])] += np.float32(rho)
    c, _ = spotrf(shifted.T, lower=1, clean=0, overwrite_a=1)
    b = beta.astype(np.float32)
    for _ in range(counts["pairs_n"]):
        y, _ = strtrs(c, b, lower=1)
        strtrs(c, y, lower=1, trans=1)
    w = np.zeros(K.shape[0])
    if support is None:
        w[:] = beta
        for _ in range(counts["products"]):
            K @ w
        return
    kss = K32.take(support, axis=0).take(support, axis=1)
    cs, _ = spotrf(kss.T, lower=1, clean=0, overwrite_a=1)
    x = r = beta[support].astype(np.float32)
    for _ in range(counts["pairs_support"]):
        y, _ = strtrs(cs, r, lower=1)
        x, _ = strtrs(cs, y, lower=1, trans=1)
    w[support] = x
    for _ in range(counts["products"]):
        K @ w


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--gamma", type=float, default=5e-4)
    ap.add_argument("--repeats", type=int, default=30)
    args = ap.parse_args()

    K, beta, _, _ = clustered_gram(args.n, 4096, seed=0)
    prob = make_problem(K, beta, gamma=args.gamma)
    on = np.flatnonzero(solve_problem(prob, method="active_set").w)
    support = int(on.size)
    ctl = threadpools()
    spotrf = sla.lapack.spotrf

    # (1) spotrf alone, threads kept busy by back-to-back calls
    shifted = K.astype(np.float32) + np.float32(0.01) * np.eye(args.n, dtype=np.float32)
    alone: dict[str, list[float]] = {}
    for _ in range(args.repeats):
        for n in (args.n, support):
            for threads in (1, 2):
                a = shifted[:n, :n].copy()  # spotrf overwrites it
                with ctl.limit(limits=threads, user_api="blas"):
                    t0 = time.perf_counter()
                    _, info = spotrf(a.T, lower=1, clean=0, overwrite_a=1)
                    alone.setdefault(f"n{n}_{threads}t", []).append(time.perf_counter() - t0)
                if info != 0:
                    raise RuntimeError(f"spotrf failed at n = {n} (info {info})")
        torch_threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            t0 = time.perf_counter()
            torch.linalg.cholesky(torch.from_numpy(shifted))
            alone.setdefault(f"torch_n{args.n}_1t", []).append(time.perf_counter() - t0)
        finally:
            torch.set_num_threads(torch_threads)

    # (2) the whole solve; the solver holds BLAS at one thread, the patched spotrf lifts it to two for its call
    inside: list[float] = []

    def spotrf_two_threads(*a, **kw):
        with ctl.limit(limits=2, user_api="blas"):
            t0 = time.perf_counter()
            out = spotrf(*a, **kw)
            inside.append(time.perf_counter() - t0)
            return out

    solve: dict[str, list[float]] = {"1t": [], "2t_spotrf": []}
    try:
        for _ in range(args.repeats):
            for key, fn in (("1t", spotrf), ("2t_spotrf", spotrf_two_threads)):
                sla.lapack.spotrf = fn
                t0 = time.perf_counter()
                solve_problem(prob, method="active_set")
                solve[key].append(time.perf_counter() - t0)
    finally:
        sla.lapack.spotrf = spotrf

    # (3) where the one-thread solve's time goes
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(args.repeats):
        solve_problem(prob, method="active_set")
    profile.disable()
    rows = sorted(pstats.Stats(profile).stats.items(), key=lambda kv: -kv[1][2])[:8]  # by own time
    own_ms = {f"{Path(f).stem}:{name}" if f != "~" else name: round(1e3 * tt / args.repeats, 2)
              for (f, _, name), (_, _, tt, _, _) in rows}

    # (4) the solve against the linear algebra it makes (the calls counted in one solve), one thread
    counts = count_calls(prob)
    rho = 0.01 * float(np.mean(np.diag(K)))
    bare: dict[str, list[float]] = {"solve": [], "skeleton": []}
    with ctl.limit(limits=1, user_api="blas"):
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            solve_problem(prob, method="active_set")
            bare["solve"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            skeleton(K, prob.beta, on, counts, rho)
            bare["skeleton"].append(time.perf_counter() - t0)

    fig = {"bench": "blas_threads", "n": args.n, "gamma": args.gamma, "support": support, "repeats": args.repeats,
           "spotrf_alone_ms": {k: stats_ms(v) for k, v in alone.items()},
           "solve_ms": {k: stats_ms(v) for k, v in solve.items()},
           "spotrf_inside_solve_2t_ms": [round(1e3 * t, 2) for t in inside],
           "profile_own_ms_per_solve_1t": own_ms,
           "calls_per_solve": counts, "skeleton_ms": {k: stats_ms(v) for k, v in bare.items()}}
    for k, v in fig["spotrf_alone_ms"].items():
        print(f"factor alone {k:>16}: min {v['min']:6.2f}  median {v['median']:6.2f}  max {v['max']:7.2f} ms")
    for k, v in fig["solve_ms"].items():
        print(f"solve {k:>17}: min {v['min']:6.2f}  median {v['median']:6.2f}  max {v['max']:7.2f} ms")
    print(f"two-thread solve / one-thread solve, medians: "
          f"{fig['solve_ms']['2t_spotrf']['median'] / fig['solve_ms']['1t']['median']:.2f}x the time")
    print(f"spotrf calls inside the two-thread solves (N, then the support of {support}), ms: "
          f"{fig['spotrf_inside_solve_2t_ms']}")
    print("one-thread solve, own time per solve (ms): " + ", ".join(f"{k} {v}" for k, v in own_ms.items()))
    s, b = fig["skeleton_ms"]["solve"], fig["skeleton_ms"]["skeleton"]
    print(f"solve against its skeleton ({counts['pairs_n']} + {counts['pairs_support']} triangular-solve pairs, "
          f"{counts['products']} products, two factorisations): solve min {s['min']:.2f} median {s['median']:.2f} ms, "
          f"skeleton min {b['min']:.2f} median {b['median']:.2f} ms, {s['median'] - b['median']:.2f} ms above it (medians)")
    print(json.dumps(fig))


if __name__ == "__main__":
    main()
