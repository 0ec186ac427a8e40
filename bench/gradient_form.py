"""solve_kmm_gradients with N <= p at a dense gamma: K formed once and the Gram form solved, against the gradient form.

Now: solve_kmm_gradients, which there forms K = G G^T and solves the Gram form (solvers.penalised.prefers_gram_form).
Before: the gradient form it ran until then, solve_penalised on the GradientOperator (ADMM on the p x p Woodbury
factor, support systems as products G_A G_A^T). Cases: `clustered:NxP` (bench/synthetic.py's clustered unit-norm
gradients at the solver bench's gamma = 5e-4) and `near:NxP` (rows 1 + 0.02 noise, gamma = 1e-3 max|beta|, where
ADMM does not settle on its own). Each round starts with the other version; prints each solve's time and the best
of --rounds per case, checks that both reach the same support and objective with KKT <= 1e-6, and ends with one JSON
line.

    .venv/bin/python bench/gradient_form.py [--cases clustered:1000x4096 near:800x1500 ...] [--rounds 3]
    .venv/bin/python bench/gradient_form.py --cases near:1500x4096 --rounds 1     # the gradient form: about 100 s
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
from timing import timed  # noqa: E402

from solvers import solve_kmm_gradients  # noqa: E402
from solvers.operators import GradientOperator  # noqa: E402
from solvers.penalised import solve_penalised  # noqa: E402
from solvers.threads import blas_threads  # noqa: E402

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=data_case, nargs="+", default=[data_case(c) for c in DEFAULT_CASES])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    versions = {"now": now, "before": before}
    warm_G, warm_g = near_parallel_gradients(40, 60, seed=1)
    for fn in versions.values():  # import and first-call costs out of the timings
        fn(warm_G, warm_g, 1e-3 * float(np.abs(warm_G @ warm_g).max()))
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
        times: dict[str, list[float]] = {v: [] for v in versions}
        results = {}
        for r in range(args.rounds):
            for name in list(versions)[r % 2:] + list(versions)[:r % 2]:
                t, (w, info) = timed(versions[name], G, g, gamma)
                results[name] = (w, info, *certificate.penalised(op, gamma, w))
                times[name].append(t)
                print(f"{kind} {n}x{p} round {r + 1} {name:<6} {t:8.3f} s  {info['strategy']}, "
                      f"{np.count_nonzero(w)} active, KKT {results[name][2]:.1e}", flush=True)
        (w_now, info_now, kkt_now, obj_now), (w_before, _, kkt_before, obj_before) = results["now"], results["before"]
        same_support = bool(np.array_equal(np.flatnonzero(w_now), np.flatnonzero(w_before)))
        if not (max(kkt_now, kkt_before) <= 1e-6 and same_support
                and abs(obj_now - obj_before) <= 1e-9 * max(1.0, abs(obj_now))):
            sys.exit(f"bench/gradient_form.py: {kind} {n}x{p}: the versions disagree (same support: {same_support}, "
                     f"KKT {kkt_now:.1e} / {kkt_before:.1e}, objectives {obj_now!r} / {obj_before!r})")
        best = {v: min(t) for v, t in times.items()}
        ratio = best["before"] / best["now"]
        print(f"{kind} {n}x{p}, gamma = {gamma:g}: now {best['now']:.3f} s (Gram formed: "
              f"{bool(info_now.get('gram_formed'))}), before {best['before']:.3f} s: {ratio:.2f}x; same support "
              f"({np.count_nonzero(w_now)} active) and objective", flush=True)
        rows.append({"data": kind, "N": n, "p": p, "gamma": gamma, "now_s": [round(t, 4) for t in times["now"]],
                     "before_s": [round(t, 4) for t in times["before"]], "speedup": round(ratio, 2),
                     "gram_formed": bool(info_now.get("gram_formed")), "active": int(np.count_nonzero(w_now)),
                     "kkt": max(kkt_now, kkt_before), "same_support": same_support})
    print(json.dumps({"bench": "gradient_form", "rounds": args.rounds, "cases": rows}))


if __name__ == "__main__":
    main()
