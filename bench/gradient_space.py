"""The gradient-space solve (K never formed) as it runs now and as it ran before, in one process.

Now: support systems of at least MIXED_MIN_N candidates factor G_A G_A^T formed from a float32 copy of G, refined
with float64 products, copying the block a support shares with the last one (sub(), the float64 matrices of small
supports and of the NNLS polish, likewise). "no reuse": the same without those copies (every support matrix a
fresh product). Before (up to d874697): G_A G_A^T formed in float64 (cast to float32 for its factor), sub() a fresh
product. ADMM's shifted factor is float64 in all three.
Data: clustered synthetic unit-norm gradients (bench/synthetic.py), the solver bench's case N = 20000, p = 4096,
gamma = 5e-4 (about 3,300 candidates active) by default; `--data near-parallel` (rows 1 + 0.02 noise, gamma a
fraction of max|beta|, N = 1500 suggested) is where ADMM does not settle and the NNLS polish, which asks sub() for
its sets, finishes. The working-set shortcuts of solve_penalised's dense chain (the probe before ADMM, the working
set after ADMM's first steps) are off in all three versions (convalue.solvers.penalised.SPARSE_PROBE_MAX = ADMM_FIRST_STEPS
= 0): this bench measures the support-matrix paths behind ADMM and its polishes. Each round starts with the next version in turn; prints each
solve's time, iterations and support, checks that all reach the same support and objective with KKT <= 1e-6, and
ends with one JSON line.

    .venv/bin/python bench/gradient_space.py [--n 20000] [--p 4096] [--gamma 5e-4] [--rounds 3]
    .venv/bin/python bench/gradient_space.py --data near-parallel --n 1500 --gamma-ratio 1e-3 --rounds 1
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
from synthetic import clustered_gradients, near_parallel_gradients  # noqa: E402
from timing import timed  # noqa: E402

import convalue.solvers.penalised  # noqa: E402
from convalue.solvers.linalg import solve_dense  # noqa: E402
from convalue.solvers.operators import GradientOperator  # noqa: E402
from convalue.solvers.penalised import solve_penalised  # noqa: E402


def plain_sub(op: GradientOperator, A: np.ndarray) -> np.ndarray:
    """G_A G_A^T as sub() formed it before it kept its last matrix."""
    GA = op.G[A]
    return GA @ GA.T


class FormerGradientOperator(GradientOperator):
    """The operator before the float32 copy of G: support matrices formed in float64 (the baseline)."""

    sub = plain_sub

    def solve_support(self, A: np.ndarray, rhs: np.ndarray) -> np.ndarray:
        return solve_dense(self.sub(A), rhs)


class NoReuseGradientOperator(GradientOperator):
    """Now's float32 paths, every support matrix a fresh product (no block copied from the last one)."""

    sub = plain_sub

    def support_gram32(self, A: np.ndarray) -> np.ndarray:
        GA32 = self.float32_copy()[A]
        return GA32 @ GA32.T


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--p", type=int, default=4096)
    ap.add_argument("--gamma", type=float, default=5e-4)
    ap.add_argument("--gamma-ratio", type=float, default=None, help="gamma as this fraction of max|beta| instead")
    ap.add_argument("--data", choices=["clustered", "near-parallel"], default="clustered")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    convalue.solvers.penalised.SPARSE_PROBE_MAX = 0  # the operator's paths behind ADMM, not the chain's shortcuts
    convalue.solvers.penalised.ADMM_FIRST_STEPS = 0
    data = clustered_gradients if args.data == "clustered" else near_parallel_gradients
    G, g = data(args.n, args.p, seed=args.seed)
    gamma = args.gamma if args.gamma_ratio is None else args.gamma_ratio * float(np.abs(G @ g).max())
    versions = {"now": GradientOperator, "no reuse": NoReuseGradientOperator, "before": FormerGradientOperator}
    names = list(versions)
    times: dict[str, list[float]] = {v: [] for v in versions}
    results = {}
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            op = versions[name](G, g)  # a fresh operator: the float32 copy of G is made inside the timed solve
            t, (w, info) = timed(solve_penalised, op, gamma)
            results[name] = (w, info, *certificate.penalised(op, gamma, w))
            times[name].append(t)
            print(f"round {r + 1} {name:<8} {t:8.2f} s  {info['strategy']}, {info['iterations']} iterations, "
                  f"{np.count_nonzero(w)} active, KKT {results[name][2]:.1e}, objective {results[name][3]:.9f}",
                  flush=True)
    w_now, _, kkt_now, obj_now = results["now"]
    kkts = {name: res[2] for name, res in results.items()}
    same_support = all(np.array_equal(np.flatnonzero(res[0]), np.flatnonzero(w_now)) for res in results.values())
    same_objective = all(abs(res[3] - obj_now) <= 1e-9 * max(1.0, abs(obj_now)) for res in results.values())
    if not (max(kkts.values()) <= 1e-6 and same_support and same_objective):
        sys.exit(f"bench/gradient_space.py: the versions disagree (same support: {same_support}, KKT {kkts}, "
                 f"objectives { {name: res[3] for name, res in results.items()} })")
    best = {v: min(t) for v, t in times.items()}
    print(f"{args.data}, N = {args.n}, p = {args.p}, gamma = {gamma:g}, best of {args.rounds}: now {best['now']:.2f} s, "
          f"no reuse {best['no reuse']:.2f} s, before {best['before']:.2f} s: {best['before'] / best['now']:.2f}x "
          f"faster than before ({best['no reuse'] / best['now']:.2f}x from the reuse); same support and objective")
    print(json.dumps({"bench": "gradient_space", "data": args.data, "N": args.n, "p": args.p, "gamma": gamma,
                      "rounds": args.rounds, **{f"{v.replace(' ', '_')}_s": [round(t, 3) for t in times[v]]
                                                for v in versions},
                      "speedup_vs_before": round(best["before"] / best["now"], 2),
                      "speedup_vs_no_reuse": round(best["no reuse"] / best["now"], 2),
                      "active": int(np.count_nonzero(w_now)), "kkt": kkts, "objective": obj_now,
                      "same_support": same_support}))


if __name__ == "__main__":
    main()
