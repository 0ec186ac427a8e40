"""The budget form past the full homotopy: the working set's exact read-off against the gamma grid.

solve_budget reads the budget (||w||_1 <= B) off the LARS homotopy's path when the homotopy is affordable (a
rank-deficient K of N * rank^2 <= 2e9); everywhere else it bracketed the budget on a warm-started gamma grid
(about 15-25 penalised solves). Now the homotopy's path on a working set of candidates, grown by KKT violators, is
tried first where K is rank-deficient (N > p) or N >= 2000, up to convalue.solvers.budget.BUDGET_WORKING_SET_MAX candidates;
"before" sets that to 0 (the grid, as it was). A dense budget (clustered:2000x4096:10, 1593 active) shows the cost
where it gives up.
Cases `kind:NxP:B` with kind `clustered` (bench/synthetic.py's clustered unit-norm gradients) or `near` (rows 1 +
0.02 noise), each in the Gram form (K = G G^T with rank min(N, p)) and the gradient form, solved by solve_budget
under solve_kmm's BLAS limit (the entry points add validation, the same in both versions). Prints time, strategy,
support size and KKT at the budget's multiplier of both, checks that both certify (KKT <= 1e-6) and reach the
same objective and l1, and ends with one JSON line.

    .venv/bin/python bench/budget_form.py                       # the default cases: about 1.5 min
    .venv/bin/python bench/budget_form.py --cases clustered:3000x4096:3 --forms gram --rounds 1
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

import convalue.solvers.budget  # noqa: E402
from convalue.solvers.operators import GradientOperator, GramOperator  # noqa: E402
from convalue.solvers.threads import blas_threads  # noqa: E402
from convalue.solvers.working_set import working_set_budget  # noqa: E402

DEFAULT_CASES = ["clustered:3000x1000:3.87", "clustered:3000x1000:6", "near:3000x1000:0.5", "clustered:5000x1024:2",
                 "clustered:5000x1024:4", "clustered:2000x4096:4", "clustered:2000x4096:10"]


def data_case(text: str) -> tuple[str, int, int, float]:
    """'clustered:NxP:B' or 'near:NxP:B' -> (kind, N, p, budget)."""
    kind, _, rest = text.partition(":")
    size, _, budget = rest.partition(":")
    if kind not in ("near", "clustered") or not budget:
        raise argparse.ArgumentTypeError(f"a case is clustered:NxP:B or near:NxP:B, got {text!r}")
    n, p = case(size)
    try:
        b = float(budget)
    except ValueError:
        b = float("nan")
    if not b > 0:
        raise argparse.ArgumentTypeError(f"the budget B must be a positive number, got {text!r}")
    return kind, n, p, b


def solve(op, budget: float, cap: int) -> tuple[float, np.ndarray, dict]:
    """(seconds, w, info) of solve_budget with BUDGET_WORKING_SET_MAX = cap, under solve_kmm's BLAS limit."""
    with swapped(convalue.solvers.budget, "BUDGET_WORKING_SET_MAX", cap), blas_threads(op.n):
        t0 = time.perf_counter()
        w, info = convalue.solvers.budget.solve_budget(op, budget)
        return time.perf_counter() - t0, w, info


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=data_case, nargs="+", default=[data_case(c) for c in DEFAULT_CASES])
    ap.add_argument("--forms", nargs="+", choices=("gram", "gradients"), default=["gram", "gradients"])
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args()

    cap = convalue.solvers.budget.BUDGET_WORKING_SET_MAX
    G0, g0 = near_parallel_gradients(40, 20, seed=1)
    for c in (cap, 0):  # imports and first calls (scikit-learn's LARS) out of the timings
        solve(GramOperator(G0 @ G0.T, G0 @ g0, rank=20), 0.5, c)
    working_set_budget(GramOperator(G0 @ G0.T, G0 @ g0, rank=20), 0.5, 1e-10)  # the path "now" takes past the homotopy
    rows = []
    for kind, n, p, budget in args.cases:
        if kind == "near":
            G, g = near_parallel_gradients(n, p, seed=0)
        else:
            G, g32 = clustered_gradients(n, p, seed=0)
            g = g32.astype(np.float64)
        for form in args.forms:
            op = GradientOperator(G, g) if form == "gradients" else GramOperator(G @ G.T, G @ g, rank=min(n, p))
            times, out = race(args.rounds, f"{kind} {n}x{p} B={budget:g} {form:<9}",
                              lambda name, op=op, b=budget: solve(op, b, cap if name == "now" else 0),
                              lambda w, info, op=op: certificate.budget(op, info["gamma"], w))
            (w_now, info_now, kkt_now, obj_now), (w_before, info_before, kkt_before, obj_before) = (
                out["now"], out["before"])
            l1_now, l1_before = float(np.abs(w_now).sum()), float(np.abs(w_before).sum())
            if not (max(kkt_now, kkt_before) <= 1e-6 and certificate.same_objective(obj_now, obj_before)
                    and max(l1_now, l1_before) <= budget * (1 + 1e-9)):
                sys.exit(f"bench/budget_form.py: {kind} {n}x{p} B={budget:g} {form}: KKT {kkt_now:.1e} / "
                         f"{kkt_before:.1e}, objectives {obj_now!r} / {obj_before!r}, l1 {l1_now!r} / {l1_before!r}")
            best, ratio, timed_fields = versus(times)
            print(f"{kind} {n}x{p} B={budget:g} {form}: now {best['now']:.3f} s ({info_now['strategy']}), before "
                  f"{best['before']:.3f} s ({info_before['strategy']}): {ratio:.2f}x; "
                  f"{np.count_nonzero(w_now)} active, the same objective", flush=True)
            rows.append({"data": kind, "N": n, "p": p, "budget": budget, "form": form} | timed_fields | {
                         "strategy_now": info_now["strategy"], "strategy_before": info_before["strategy"],
                         "active": int(np.count_nonzero(w_now)), "kkt": max(kkt_now, kkt_before)})
    print(json.dumps({"bench": "budget_form", "working_set_max": cap, "rounds": args.rounds, "cases": rows}))


if __name__ == "__main__":
    main()
