"""Stopping at a tolerance: solve_problem(tol=T) against the exact default, on dense solutions of clustered data.

With tol, ADMM on a support whose factorisation would cost more (solvers.admm.EARLY_STOP_CUBE_RATIO) goes on past
the support's settling with Anderson acceleration and returns its own iterate once the KKT conditions hold to T,
instead of polishing to round-off. "before" is the exact default (the polish). Cases `NxP` of bench/synthetic.py's
clustered unit-norm gradients (K = G G^T in float64, as bench/solvers.py forms it), each at every gamma; both
versions interleaved over rounds, each the best of `--repeat` solves of the same validated problem. Prints times,
iterations, support sizes and KKT, checks that the early answer is certified at T with an objective within 1e-9
of the exact one, and ends with one JSON line.

    .venv/bin/python bench/early_stop.py                                   # N = 500, 1000, 2000: about 1 min
    .venv/bin/python bench/early_stop.py --cases 1000x4096 --gammas 5e-4 --rounds 5
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

# the repository root first (bench/solvers.py is named like the package), bench/ last
sys.path[0] = str(Path(__file__).resolve().parents[1])
sys.path.append(str(Path(__file__).resolve().parent))

import certificate  # noqa: E402
from synthetic import case, clustered_gradients  # noqa: E402
from timing import interleaved, timed, versus  # noqa: E402

from solvers import make_problem, solve_problem  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=case, nargs="+", default=[case(c) for c in ("500x4096", "1000x4096", "2000x4096")])
    ap.add_argument("--gammas", type=float, nargs="+", default=[1e-4, 2e-4, 5e-4, 1e-3, 2e-3])
    ap.add_argument("--tol", type=float, default=1e-6)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=5, help="solves per version and round (the best counts)")
    args = ap.parse_args()

    G0, g0 = clustered_gradients(200, 256, seed=1)
    warm = make_problem((G0 @ G0.T).astype(np.float64), G0.astype(np.float64) @ g0.astype(np.float64), gamma=1e-4)
    solve_problem(warm), solve_problem(warm, tol=args.tol)  # first calls out of the timings
    rows = []
    for n, p in args.cases:
        G, g32 = clustered_gradients(n, p, seed=0)
        G64 = G.astype(np.float64)
        K = G64 @ G64.T
        beta = G64 @ g32.astype(np.float64)
        for gamma in args.gammas:
            prob = make_problem(K, beta, gamma=gamma)
            scale = max(1.0, float(np.abs(beta).max()))
            times: dict[str, list[float]] = {"now": [], "before": []}
            sols = {}
            for _, name in interleaved(args.rounds, times):
                t, sols[name] = timed(solve_problem, prob, tol=args.tol if name == "now" else None, repeat=args.repeat)
                times[name].append(t)
            now, before = sols["now"], sols["before"]
            if not (now.kkt <= args.tol * scale and before.kkt <= 1e-12 * scale
                    and certificate.same_objective(now.objective, before.objective)):
                sys.exit(f"bench/early_stop.py: {n}x{p} gamma={gamma:g}: KKT {now.kkt:.1e} / {before.kkt:.1e}, "
                         f"objectives {now.objective!r} / {before.objective!r}")
            best, ratio, timed_fields = versus(times)
            stopped = bool(now.info.get("early_stop"))  # ADMM's own iterate answered (else the polish, as without tol)
            print(f"{n}x{p} gamma={gamma:g}: tol={args.tol:g} {best['now'] * 1e3:.2f} ms ({now.iterations} iterations, "
                  f"KKT {now.kkt:.1e}, {'early stop' if stopped else 'polished'}), exact {best['before'] * 1e3:.2f} ms "
                  f"({before.iterations} iterations): {ratio:.2f}x; {np.count_nonzero(before.w)} active", flush=True)
            rows.append({"N": n, "p": p, "gamma": gamma} | timed_fields | {
                         "early_stop": bool(stopped), "active": int(np.count_nonzero(before.w)),
                         "iterations_now": now.iterations, "iterations_before": before.iterations,
                         "kkt_now": now.kkt, "kkt_before": before.kkt})
    print(json.dumps({"bench": "early_stop", "tol": args.tol, "rounds": args.rounds, "repeat": args.repeat,
                      "cases": rows}))


if __name__ == "__main__":
    main()
