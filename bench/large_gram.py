"""A Gram problem beyond N = 8000 with N > p: validation and a dense solve, as the pipeline now runs them and before.

Clustered synthetic unit-norm gradients (bench/synthetic.py), K = G G^T of rank p, in one process:
  validation   make_problem with rank_bound = p (the pipeline's bound: a pivoted Cholesky certifies PSD-ness and
               gives the rank) against make_problem without it (an estimate of lambda_min, rank unknown)
  solve        solve_penalised on the validated problem at a dense gamma: ADMM + polish (the Gram form's default
               up to N = 20000) against the former limit admm_max_n = 6000 (the PDAS chain), capped at --cap s
Below N = 8000 (smoke runs) the validation thresholds, the former ADMM limit and the homotopy's limit are lowered,
so the same branches run. Prints both pairs with their ratios and ends with one JSON line.

    .venv/bin/python bench/large_gram.py [--n 10000 --p 2048 --gamma 5e-4 --cap 120]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

# the repository root first (bench/solvers.py is named like the package), bench/ last
sys.path[0] = str(Path(__file__).resolve().parents[1])
sys.path.append(str(Path(__file__).resolve().parent))

from synthetic import clustered_gradients  # noqa: E402

import convalue.solvers.homotopy as homotopy_module  # noqa: E402
import convalue.solvers.problem as problem_module  # noqa: E402
from convalue.solvers import kkt_violation, make_problem  # noqa: E402
from convalue.solvers.operators import GramOperator  # noqa: E402
from convalue.solvers.penalised import solve_penalised  # noqa: E402
from convalue.solvers.threads import blas_threads  # noqa: E402

FORMER_ADMM_MAX_N = 6000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=10000)
    ap.add_argument("--p", type=int, default=2048)
    ap.add_argument("--gamma", type=float, default=5e-4)
    ap.add_argument("--cap", type=float, default=120.0, help="seconds allowed to the former solve")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if not 0 < args.p < args.n:
        ap.error("the bench needs 0 < p < N")
    if args.n <= problem_module.PIVOTED_MAX_N:  # a smoke run: the same branches at a small N
        problem_module.EIGVALSH_MAX_N = problem_module.PIVOTED_MAX_N = args.n - 1
        homotopy_module.HOMOTOPY_MAX_WORK = 0.0
    former_max_n = min(FORMER_ADMM_MAX_N, args.n - 1)

    G, g32 = clustered_gradients(args.n, args.p, seed=args.seed)
    K = G @ G.T
    beta = G @ g32.astype(np.float64)
    del G
    rec: dict = {"bench": "large_gram", "N": args.n, "p": args.p, "gamma": args.gamma, "cap_s": args.cap}

    t0 = time.perf_counter()
    prob = make_problem(K, beta, gamma=args.gamma, rank_bound=args.p)
    rec["validate_bound_s"], rec["rank_bound_result"] = round(time.perf_counter() - t0, 2), prob.rank
    t0 = time.perf_counter()
    rec["rank_without_bound"] = make_problem(K, beta, gamma=args.gamma).rank
    rec["validate_former_s"] = round(time.perf_counter() - t0, 2)
    rec["validate_speedup"] = round(rec["validate_former_s"] / max(rec["validate_bound_s"], 0.01), 1)
    print(f"validation  with rank_bound={args.p}: {rec['validate_bound_s']:.2f} s, rank {prob.rank}; "
          f"without: {rec['validate_former_s']:.2f} s, rank {rec['rank_without_bound']} "
          f"({rec['validate_speedup']}x)", flush=True)

    op = GramOperator(prob.K, prob.beta, rank=prob.rank)
    for name, max_n in (("solve", None), ("former", former_max_n)):
        kw = {} if max_n is None else {"admm_max_n": max_n, "max_seconds": args.cap}
        t0 = time.perf_counter()
        with blas_threads(op.n):
            w, info = solve_penalised(op, args.gamma, **kw)
        t = time.perf_counter() - t0
        kkt = kkt_violation(prob, w)
        rec |= {f"{name}_s": round(t, 2), f"{name}_kkt": kkt, f"{name}_converged": bool(info["converged"]),
                f"{name}_strategy": info["strategy"], f"{name}_nnz": int(np.count_nonzero(w))}
        label = "ADMM up to N = 20000" if max_n is None else f"admm_max_n = {max_n}, cap {args.cap:.0f} s"
        print(f"{name:<7} ({label}): {t:.2f} s, KKT {kkt:.1e}, {info['strategy']}, "
              f"{'converged' if info['converged'] else 'NOT converged'}, {rec[f'{name}_nnz']} active", flush=True)
    rec["solve_speedup"] = round(rec["former_s"] / max(rec["solve_s"], 0.01), 1)
    print(f"the solve is {rec['solve_speedup']}x faster (a lower bound when the former solve hit its cap)")
    print(json.dumps(rec, default=float))


if __name__ == "__main__":
    main()
