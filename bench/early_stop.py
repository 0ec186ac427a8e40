"""Stopping at a tolerance: solve_problem(tol=T) against the exact default, on dense solutions.

With tol, ADMM on a support whose factorisation would cost more (convalue.solvers.admm.EARLY_STOP_CUBE_RATIO) goes on past
the support's settling with Anderson acceleration and returns its own iterate once the KKT conditions hold to T,
instead of polishing to round-off, where K is not nearly singular (convalue.solvers.admm.EARLY_STOP_MIN_LAMBDA); every other
answer stays exact. "before" is the exact default, or with `--versus plain` the same stop with plain ADMM steps past
the settling (convalue.solvers.admm.ANDERSON_MEMORY = 0: what Anderson's steps are worth). Cases `NxP` of
bench/synthetic.py's clustered unit-norm gradients, each at every `--gammas`, and `nearK:NxP`, near-parallel rows (1 + 0.02 noise) with the target the mean of K of them, at `--near-ratio` max|beta|
(K = G G^T in float64, as bench/solvers.py forms it). Both versions interleaved over rounds, each the best of
`--repeat` solves of the same validated problem. Prints times, strategies, iterations, support sizes and KKT,
checks that the answer at T is certified at T (the exact one at 1e-10, the default) and is not below the exact
objective, prints how far above it is, how far its scores moved (relative to the largest) and how much of the top 3
and top 20 positive candidates (convalue.engine.selection.select) it shares with the exact answer, and ends with one JSON line.

    .venv/bin/python bench/early_stop.py                                   # N = 500, 1000, 2000: about 1 min
    .venv/bin/python bench/early_stop.py --cases 1000x4096 --gammas 5e-4 --rounds 5
    .venv/bin/python bench/early_stop.py --cases near5:1000x4096 near100:3000x1000 near1000:1500x4096 --repeat 1
    .venv/bin/python bench/early_stop.py --versus plain    # "before": the same stop without Anderson's steps
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

from synthetic import case, clustered_gradients, near_parallel_gradients  # noqa: E402
from timing import interleaved, swapped, timed, versus  # noqa: E402

import convalue.solvers.admm  # noqa: E402
from convalue.engine.selection.select import select_top_k  # noqa: E402
from convalue.solvers import make_problem, solve_problem  # noqa: E402


def data_case(text: str) -> tuple[int, int, int]:
    """'NxP' (clustered) or 'nearK:NxP' (near-parallel, the target the mean of K rows) -> (K or 0, N, p)."""
    kind, _, size = text.rpartition(":")
    if kind and not (kind.startswith("near") and kind[4:].isdigit() and int(kind[4:]) > 0):
        raise argparse.ArgumentTypeError(f"a case is NxP (clustered) or nearK:NxP (K > 0), got {text!r}")
    return (int(kind[4:]) if kind else 0), *case(size)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=data_case, nargs="+",
                    default=[data_case(c) for c in ("500x4096", "1000x4096", "2000x4096")])
    ap.add_argument("--gammas", type=float, nargs="+", default=[1e-4, 2e-4, 5e-4, 1e-3, 2e-3],
                    help="the clustered cases' gammas")
    ap.add_argument("--near-ratio", type=float, default=1e-3, help="the near-parallel cases' gamma / max|beta|")
    ap.add_argument("--tol", type=float, default=1e-6)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=5, help="solves per version and round (the best counts)")
    ap.add_argument("--versus", choices=("exact", "plain"), default="exact",
                    help="'before': the exact default, or the same tol with plain ADMM steps (ANDERSON_MEMORY = 0)")
    args = ap.parse_args()

    G0, g0 = clustered_gradients(200, 256, seed=1)
    G1, g1 = near_parallel_gradients(200, 400, seed=1, mix=30)  # the working-set homotopy (scikit-learn's LARS)
    for warm in (make_problem((G0 @ G0.T).astype(np.float64), G0.astype(np.float64) @ g0.astype(np.float64),
                              gamma=1e-4),
                 make_problem(G1 @ G1.T, G1 @ g1, gamma=1e-3 * float(np.abs(G1 @ g1).max()), rank_bound=200)):
        solve_problem(warm), solve_problem(warm, tol=args.tol)  # first calls out of the timings
    rows = []
    for mix, n, p in args.cases:
        if mix:
            G64, g = near_parallel_gradients(n, p, seed=0, mix=mix)
        else:
            G, g32 = clustered_gradients(n, p, seed=0)
            G64, g = G.astype(np.float64), g32.astype(np.float64)
        K = G64 @ G64.T
        beta = G64 @ g
        label = f"near{mix}:{n}x{p}" if mix else f"{n}x{p}"
        for gamma in [args.near_ratio * float(np.abs(beta).max())] if mix else args.gammas:
            prob = make_problem(K, beta, gamma=gamma, rank_bound=min(n, p))
            scale = max(1.0, float(np.abs(beta).max()))
            times: dict[str, list[float]] = {"now": [], "before": []}
            sols = {}
            for _, name in interleaved(args.rounds, times):
                plain = name == "before" and args.versus == "plain"
                with swapped(convalue.solvers.admm, "ANDERSON_MEMORY", 0 if plain else convalue.solvers.admm.ANDERSON_MEMORY):
                    t, sols[name] = timed(solve_problem, prob, tol=args.tol if name == "now" or plain else None,
                                          repeat=args.repeat)
                times[name].append(t)
            now, before = sols["now"], sols["before"]
            before_tol = args.tol if args.versus == "plain" else 1e-10
            gap = (now.objective - before.objective) / max(1.0, abs(before.objective))  # what stopping at T gives up
            drift = float(np.abs(now.w - before.w).max() / max(np.abs(before.w).max(), 1e-300))  # the scores' change
            top = [len(set(select_top_k(now.w, beta, k)) & set(select_top_k(before.w, beta, k))) / k for k in (3, 20)]
            if not (now.kkt <= args.tol * scale and before.kkt <= before_tol * scale
                    and (gap >= -1e-9 or args.versus == "plain")):
                sys.exit(f"bench/early_stop.py: {label} gamma={gamma:g}: KKT {now.kkt:.1e} / {before.kkt:.1e}, "
                         f"objectives {now.objective!r} / {before.objective!r}")
            best, ratio, timed_fields = versus(times)
            stopped = bool(now.info.get("early_stop"))  # ADMM's own iterate answered (else the polish, as without tol)
            print(f"{label} gamma={gamma:g}: tol={args.tol:g} {best['now'] * 1e3:.2f} ms ({now.info['strategy']}, "
                  f"{now.iterations} iterations, KKT {now.kkt:.1e}{', early stop' if stopped else ''}), {args.versus} "
                  f"{best['before'] * 1e3:.2f} ms ({before.info['strategy']}, {before.iterations} iterations): "
                  f"{ratio:.2f}x; {np.count_nonzero(before.w)} active, objective {gap:.1e} above the {args.versus} one, scores within "
                  f"{drift:.1e} of the largest, top 3 / 20 {top[0]:.2f} / {top[1]:.2f} the same", flush=True)
            rows.append({"data": "near" if mix else "clustered", "mix": mix, "N": n, "p": p, "gamma": gamma}
                        | timed_fields | {"strategy_now": now.info["strategy"], "strategy_before": before.info["strategy"],
                         "early_stop": bool(stopped), "active": int(np.count_nonzero(before.w)),
                         "iterations_now": now.iterations, "iterations_before": before.iterations,
                         "kkt_now": now.kkt, "kkt_before": before.kkt, "objective_gap": gap, "score_drift": drift,
                         "top3_same": top[0], "top20_same": top[1]})
    print(json.dumps({"bench": "early_stop", "tol": args.tol, "versus": args.versus, "rounds": args.rounds,
                      "repeat": args.repeat,
                      "cases": rows}))


if __name__ == "__main__":
    main()
