"""Dense by the ratio, sparse in fact: the working-set shortcuts of the dense chain, against the chain without them.

solve_penalised calls a gamma below 1 % of max|beta| dense and starts with ADMM. On near-parallel gradients (rows
1 + 0.02 noise, bench/synthetic.py) the solution at 1e-3 max|beta| has 5 active candidates, and where ADMM is costly
(a rank-deficient K, N > p, in the Gram or the gradient form, or N of a few thousand) it crawls and its polishes
fail for thousands of steps. Now, there, the working-set homotopy is tried first on at most
convalue.solvers.penalised.SPARSE_PROBE_MAX candidates (the probe); and at any N, where ADMM's first rho has not finished
in convalue.solvers.penalised.ADMM_FIRST_STEPS steps, the working set up to its full cap goes next (a target mixing 30-100
such rows has 100-300 active, past the probe, where ADMM fails at every rho). "before" sets both to 0 (the chain as
it was); with `--versus seed`, "before" is the chain as it is but for the working set after ADMM's first steps,
which then starts from the largest |beta| alone instead of also from ADMM's iterate
(convalue.solvers.penalised.ADMM_FIRST_SEEDED off). Cases `near:NxP` (target the mean of 5 rows) and `nearK:NxP` (of K rows, e.g. near100:3000x1000; gamma =
1e-3 max|beta|) show the gain, `clustered:NxP` (gamma = 5e-4, hundreds to thousands active, where the probe gives
up and ADMM finishes) the cost; each in the Gram form (K = G G^T with rank p) and the gradient form. Prints time,
strategy and KKT of both and the probe's own time (the ADMM solves above N = 2000 run on two BLAS threads and vary
by 20 % on this host, more than the probe costs), checks that both certify (KKT <= 1e-6) with the same objective,
and ends with one JSON line.

    .venv/bin/python bench/sparse_probe.py [--cases near:5000x1024 clustered:5000x1024] [--rounds 1]   # 2-3 min
    .venv/bin/python bench/sparse_probe.py --cases near:3000x1000      # before: 451 s in the Gram form
    .venv/bin/python bench/sparse_probe.py --cases near100:2000x4096 near100:1000x4096 --forms gram  # before: 2 min
    .venv/bin/python bench/sparse_probe.py --cases clustered:20000x4096 --forms gradients   # the solver bench's case
    .venv/bin/python bench/sparse_probe.py --versus seed --forms gram --cases near1000:1500x4096 near300:3000x1000
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

import certificate  # noqa: E402
from synthetic import case, clustered_gradients, near_parallel_gradients  # noqa: E402
from timing import race, swapped, versus  # noqa: E402

import convalue.solvers.penalised  # noqa: E402
from convalue.solvers.operators import GradientOperator, GramOperator  # noqa: E402
from convalue.solvers.threads import blas_threads  # noqa: E402
from convalue.solvers.working_set import working_set_homotopy  # noqa: E402

DEFAULT_CASES = ["near:5000x1024", "clustered:5000x1024"]


def data_case(text: str) -> tuple[str, int, int]:
    """'near:NxP', 'nearK:NxP' or 'clustered:NxP' -> (kind, N, p)."""
    kind, _, size = text.partition(":")
    if not (kind in ("near", "clustered") or (kind.startswith("near") and kind[4:].isdigit() and int(kind[4:]) > 0)):
        raise argparse.ArgumentTypeError(f"a case is near:NxP, nearK:NxP (K > 0) or clustered:NxP, got {text!r}")
    n, p = case(size)
    return kind, n, p


def solve(op, gamma: float, now: bool, against: str, max_seconds: float | None) -> tuple[float, np.ndarray, dict]:
    """(seconds, w, info) of solve_penalised as it is (now), or before: with both working-set shortcuts off (against
    "shortcuts", the chain before them) or with the working set after ADMM's first steps unseeded (against "seed"),
    under solve_kmm's BLAS limit and the chain's own deadline."""
    shortcuts = now or against == "seed"
    probe = convalue.solvers.penalised.SPARSE_PROBE_MAX if shortcuts else 0
    first = convalue.solvers.penalised.ADMM_FIRST_STEPS if shortcuts else 0
    seeded = convalue.solvers.penalised.ADMM_FIRST_SEEDED and (now or against != "seed")
    with swapped(convalue.solvers.penalised, "SPARSE_PROBE_MAX", probe), \
            swapped(convalue.solvers.penalised, "ADMM_FIRST_STEPS", first), \
            swapped(convalue.solvers.penalised, "ADMM_FIRST_SEEDED", seeded), blas_threads(op.n):
        t0 = time.perf_counter()
        w, info = convalue.solvers.penalised.solve_penalised(op, gamma, max_seconds=max_seconds)
        return time.perf_counter() - t0, w, info


def probe_alone(op, gamma: float, probe_max: int) -> float:
    """Seconds of the working-set probe by itself (as solve_penalised calls it), under the same BLAS limit."""
    scale = 1e-10 * max(1.0, float(np.abs(op.beta).max()))
    with blas_threads(op.n):
        t0 = time.perf_counter()
        working_set_homotopy(op, gamma, scale, start=convalue.solvers.penalised.SPARSE_PROBE_START, max_size=probe_max)
        return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=data_case, nargs="+", default=[data_case(c) for c in DEFAULT_CASES])
    ap.add_argument("--forms", nargs="+", choices=("gram", "gradients"), default=["gram", "gradients"])
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--max-seconds", type=float, default=None,
                    help="the chain's deadline (solve_penalised's max_seconds); a 'before' that misses it is reported "
                         "uncertified and the ratio as a lower bound, 'now' must certify")
    ap.add_argument("--versus", choices=("shortcuts", "seed"), default="shortcuts",
                    help="'before': the chain without both working-set shortcuts, or without the seed of the working "
                         "set after ADMM's first steps (ADMM_FIRST_SEEDED)")
    args = ap.parse_args()

    probe = convalue.solvers.penalised.SPARSE_PROBE_MAX
    working_set_homotopy(GramOperator(np.eye(4) + 0.1, np.arange(1.0, 5.0)), 0.5, 1e-10)  # imports, first calls
    rows = []
    for kind, n, p in args.cases:
        if kind.startswith("near"):
            G, g = near_parallel_gradients(n, p, seed=0, mix=int(kind[4:] or 5))
            gamma = 1e-3 * float(np.abs(G @ g).max())
        else:
            G, g32 = clustered_gradients(n, p, seed=0)
            g, gamma = g32.astype(np.float64), 5e-4
        for form in args.forms:
            op = GradientOperator(G, g) if form == "gradients" else GramOperator(G @ G.T, G @ g, rank=min(n, p))
            times, out = race(args.rounds, f"{kind} {n}x{p} {form:<9}",
                              lambda name, op=op, gm=gamma: solve(op, gm, name == "now", args.versus,
                                                                  args.max_seconds),
                              lambda w, info, op=op, gm=gamma: certificate.penalised(op, gm, w))
            kkt_now, kkt_before = out["now"][2], out["before"][2]
            obj_now, obj_before = out["now"][3], out["before"][3]
            # "before" may miss the deadline (then it is reported so, and the ratio is a lower bound); "now" may not
            before_done = bool(out["before"][1]["converged"])
            agree = not before_done or (kkt_before <= 1e-6 and certificate.same_objective(obj_now, obj_before))
            if not (kkt_now <= 1e-6 and agree):
                sys.exit(f"bench/sparse_probe.py: {kind} {n}x{p} {form}: KKT {kkt_now:.1e} / {kkt_before:.1e}, "
                         f"objectives {obj_now!r} / {obj_before!r}")
            best, ratio, timed_fields = versus(times)
            # the probe by itself: its cost where it gives up, free of the noise of the ADMM solve that follows it
            probe_s = min(probe_alone(op, gamma, probe) for _ in range(max(args.rounds, 3)))
            missed = "" if before_done else f", not certified at the {args.max_seconds:g} s deadline (KKT " \
                                            f"{kkt_before:.1e}), so at least"
            print(f"{kind} {n}x{p} {form}: now {best['now']:.3f} s ({out['now'][1]['strategy']}), before "
                  f"{best['before']:.3f} s ({out['before'][1]['strategy']}{missed}): {ratio:.2f}x; the probe alone "
                  f"{1e3 * probe_s:.1f} ms", flush=True)
            rows.append({"data": kind, "N": n, "p": p, "form": form, "gamma": gamma} | timed_fields | {
                         "probe_s": round(probe_s, 4),
                         "strategy_now": out["now"][1]["strategy"], "strategy_before": out["before"][1]["strategy"],
                         "active": int(np.count_nonzero(out["now"][0])), "kkt": kkt_now, "kkt_before": kkt_before,
                         "before_certified": before_done})
    print(json.dumps({"bench": "sparse_probe", "versus": args.versus, "probe_max": probe, "admm_first_steps": convalue.solvers.penalised.ADMM_FIRST_STEPS,
                      "rounds": args.rounds, "max_seconds": args.max_seconds, "cases": rows}))


if __name__ == "__main__":
    main()
