"""solve_kmm_gradients with N <= p at a dense gamma: K formed once and the Gram form solved, against the gradient form.

Now: solve_kmm_gradients, which there forms K = G G^T and solves the Gram form (convalue.solvers.penalised.prefers_gram_form).
Before: the gradient form it ran until then, solve_penalised on the GradientOperator (ADMM on the p x p Woodbury
factor, support systems as products G_A G_A^T). Cases: `clustered:NxP` (bench/synthetic.py's clustered unit-norm
gradients at the solver bench's gamma = 5e-4) and `near:NxP` (rows 1 + 0.02 noise, gamma = 1e-3 max|beta|, where
ADMM does not settle on its own). Each round starts with the other version; prints each solve's time and the best
of --rounds per case, checks that both reach the same support and objective with KKT <= 1e-6, and ends with one JSON
line.

With --budgets, each case is solved in the budget form (||w||_1 <= B) at each B instead: now, solve_budget forms K
when its gamma grid first reaches a dense gamma (info "gram_formed"); before, it kept the gradient form throughout
(convalue.solvers.budget.prefers_gram_form answering False). Both are certified at the budget's multiplier.

    .venv/bin/python bench/gradient_form.py [--cases clustered:1000x4096 near:800x1500 ...] [--rounds 3]
    .venv/bin/python bench/gradient_form.py --cases near:1500x4096 --rounds 1     # the gradient form: about 100 s
    .venv/bin/python bench/gradient_form.py --cases clustered:1000x4096 --budgets 3 6   # before: about 20 s each
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
from synthetic import case, clustered_gradients, near_parallel_gradients  # noqa: E402
from timing import race, swapped, timed, versus  # noqa: E402

import convalue.solvers.budget  # noqa: E402
from convalue.solvers import solve_kmm_gradients  # noqa: E402
from convalue.solvers.operators import GradientOperator  # noqa: E402
from convalue.solvers.penalised import solve_penalised  # noqa: E402
from convalue.solvers.threads import blas_threads  # noqa: E402

DEFAULT_CASES = ["clustered:800x1000", "clustered:1000x4096", "clustered:3000x4096", "near:300x400", "near:800x1500"]


def data_case(text: str) -> tuple[str, int, int]:
    """'clustered:NxP' or 'near:NxP' -> (kind, N, p), N <= p."""
    kind, _, size = text.partition(":")
    if kind not in ("clustered", "near"):
        raise argparse.ArgumentTypeError(f"a case is clustered:NxP or near:NxP, got {text!r}")
    n, p = case(size)
    if n > p:
        raise argparse.ArgumentTypeError(f"N <= p is the case this bench measures, got {text!r}")
    return kind, n, p


def now(G: np.ndarray, g: np.ndarray, gamma: float) -> tuple[np.ndarray, dict]:
    """The public entry point as it runs now."""
    sol = solve_kmm_gradients(G, g, gamma=gamma)
    return sol.w, sol.info


def before(G: np.ndarray, g: np.ndarray, gamma: float) -> tuple[np.ndarray, dict]:
    """The gradient form, as solve_kmm_gradients ran it before (one BLAS thread, as it holds)."""
    op = GradientOperator(G, g)
    with blas_threads(op.n):
        return solve_penalised(op, gamma)


def budget_now(G: np.ndarray, g: np.ndarray, budget: float) -> tuple[np.ndarray, dict]:
    """The budget form through the public entry point as it runs now."""
    sol = solve_kmm_gradients(G, g, budget=budget)
    return sol.w, sol.info


def budget_before(G: np.ndarray, g: np.ndarray, budget: float) -> tuple[np.ndarray, dict]:
    """The budget form with the gradient form kept throughout, as solve_budget ran it before."""
    with swapped(convalue.solvers.budget, "prefers_gram_form", lambda op, gamma: False):
        return budget_now(G, g, budget)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=data_case, nargs="+", default=[data_case(c) for c in DEFAULT_CASES])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--budgets", type=float, nargs="+", default=None,
                    help="solve the budget form at each of these l1 budgets instead of the penalised form")
    args = ap.parse_args()
    if args.budgets is not None and min(args.budgets) <= 0:
        ap.error(f"--budgets must be positive, got {args.budgets}")

    form = "penalised" if args.budgets is None else "budget"
    versions = {"now": now, "before": before} if form == "penalised" else {"now": budget_now, "before": budget_before}
    warm_G, warm_g = near_parallel_gradients(40, 60, seed=1)
    for fn in versions.values():  # import and first-call costs out of the timings
        fn(warm_G, warm_g, 1e-3 * float(np.abs(warm_G @ warm_g).max()) if form == "penalised" else 0.5)
    rows = []
    for kind, n, p in args.cases:
        if kind == "clustered":
            G, g32 = clustered_gradients(n, p, seed=args.seed)
            g = g32.astype(np.float64)
            gamma = 5e-4
        else:
            G, g = near_parallel_gradients(n, p, seed=args.seed)
            gamma = 1e-3 * float(np.abs(G @ g).max())
        op = GradientOperator(G, g)  # to certify both answers the same way
        for setting in ([gamma] if form == "penalised" else args.budgets):
            rows.append(compare(versions, G, g, op, kind, setting, form, args.rounds))
    print(json.dumps({"bench": "gradient_form", "form": form, "rounds": args.rounds, "cases": rows}))


def compare(versions: dict, G: np.ndarray, g: np.ndarray, op, kind: str, setting: float, form: str,
            rounds: int) -> dict:
    """Time both versions at one gamma (or budget), check that they agree, print the case; its JSON row."""
    n, p = G.shape
    name_of = "gamma" if form == "penalised" else "budget"

    def run(name: str) -> tuple[float, np.ndarray, dict]:
        t, (w, info) = timed(versions[name], G, g, setting)
        return t, w, info

    def certify(w: np.ndarray, info: dict) -> tuple[float, float]:
        if form == "penalised":
            return certificate.penalised(op, setting, w)
        return certificate.budget(op, info["multiplier"], w)

    times, results = race(rounds, f"{kind} {n}x{p}", run, certify)
    (w_now, info_now, kkt_now, obj_now), (w_before, _, kkt_before, obj_before) = results["now"], results["before"]
    same_support = bool(np.array_equal(np.flatnonzero(w_now), np.flatnonzero(w_before)))
    if not (max(kkt_now, kkt_before) <= 1e-6 and same_support and certificate.same_objective(obj_now, obj_before)):
        sys.exit(f"bench/gradient_form.py: {kind} {n}x{p}: the versions disagree (same support: {same_support}, "
                 f"KKT {kkt_now:.1e} / {kkt_before:.1e}, objectives {obj_now!r} / {obj_before!r})")
    best, ratio, timed_fields = versus(times)
    print(f"{kind} {n}x{p}, {name_of} = {setting:g}: now {best['now']:.3f} s (Gram formed: "
          f"{bool(info_now.get('gram_formed'))}), before {best['before']:.3f} s: {ratio:.2f}x; same support "
          f"({np.count_nonzero(w_now)} active) and objective", flush=True)
    return {"data": kind, "N": n, "p": p, name_of: setting} | timed_fields | {
            "gram_formed": bool(info_now.get("gram_formed")), "active": int(np.count_nonzero(w_now)),
            "kkt": max(kkt_now, kkt_before), "same_support": same_support}


if __name__ == "__main__":
    main()
