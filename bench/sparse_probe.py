"""Dense by the ratio, sparse in fact: the working-set probe before ADMM, against the chain without it.

solve_penalised calls a gamma below 1 % of max|beta| dense and starts with ADMM. On near-parallel gradients (rows
1 + 0.02 noise, bench/synthetic.py) the solution at 1e-3 max|beta| has 5 active candidates, and where ADMM is costly
(a rank-deficient K, N > p, in the Gram or the gradient form, or N of a few thousand) it crawls and its polishes
fail for thousands of steps. Now, there, the working-set homotopy is tried first on at most
solvers.penalised.SPARSE_PROBE_MAX candidates; "before" sets that to 0 (the chain as it was). Cases `near:NxP`
(gamma = 1e-3 max|beta|) show the gain, `clustered:NxP` (gamma = 5e-4, hundreds to thousands active, where the
probe gives up) its cost; each in the Gram form (K = G G^T with rank p) and the gradient form. The probe runs where
K is rank-deficient or N >= SPARSE_PROBE_MIN_N: give such a case. Prints time, strategy and KKT of both and the
probe's own time (the ADMM solves above N = 2000 run on two BLAS threads and vary by 20 % on this host, more than
the probe costs), checks that both certify (KKT <= 1e-6) with the same objective, and ends with one JSON line.

    .venv/bin/python bench/sparse_probe.py [--cases near:5000x1024 clustered:5000x1024] [--rounds 1]   # 2-3 min
    .venv/bin/python bench/sparse_probe.py --cases near:3000x1000      # before: 451 s in the Gram form
    .venv/bin/python bench/sparse_probe.py --cases clustered:20000x4096 --forms gradients   # the solver bench's case
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
from timing import swapped  # noqa: E402

import solvers.penalised  # noqa: E402
from solvers.operators import GradientOperator, GramOperator  # noqa: E402
from solvers.threads import blas_threads  # noqa: E402
from solvers.working_set import working_set_homotopy  # noqa: E402

DEFAULT_CASES = ["near:5000x1024", "clustered:5000x1024"]


def data_case(text: str) -> tuple[str, int, int]:
    """'near:NxP' or 'clustered:NxP' -> (kind, N, p)."""
    kind, _, size = text.partition(":")
    if kind not in ("near", "clustered"):
        raise argparse.ArgumentTypeError(f"a case is near:NxP or clustered:NxP, got {text!r}")
    n, p = case(size)
    if n <= p and n < solvers.penalised.SPARSE_PROBE_MIN_N:
        raise argparse.ArgumentTypeError(f"the probe runs where K is rank-deficient (N > p) or N >= "
                                         f"{solvers.penalised.SPARSE_PROBE_MIN_N}: got {text!r}")
    return kind, n, p


def solve(op, gamma: float, probe_max: int) -> tuple[float, np.ndarray, dict]:
    """(seconds, w, info) of solve_penalised with SPARSE_PROBE_MAX = probe_max, under solve_kmm's BLAS limit."""
    with swapped(solvers.penalised, "SPARSE_PROBE_MAX", probe_max), blas_threads(op.n):
        t0 = time.perf_counter()
        w, info = solvers.penalised.solve_penalised(op, gamma)
        return time.perf_counter() - t0, w, info


def probe_alone(op, gamma: float, probe_max: int) -> float:
    """Seconds of the working-set probe by itself (as solve_penalised calls it), under the same BLAS limit."""
    scale = 1e-10 * max(1.0, float(np.abs(op.beta).max()))
    with blas_threads(op.n):
        t0 = time.perf_counter()
        working_set_homotopy(op, gamma, scale, start=solvers.penalised.SPARSE_PROBE_START, max_size=probe_max)
        return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=data_case, nargs="+", default=[data_case(c) for c in DEFAULT_CASES])
    ap.add_argument("--forms", nargs="+", choices=("gram", "gradients"), default=["gram", "gradients"])
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args()

    probe = solvers.penalised.SPARSE_PROBE_MAX
    working_set_homotopy(GramOperator(np.eye(4) + 0.1, np.arange(1.0, 5.0)), 0.5, 1e-10)  # imports, first calls
    rows = []
    for kind, n, p in args.cases:
        if kind == "near":
            G, g = near_parallel_gradients(n, p, seed=0)
            gamma = 1e-3 * float(np.abs(G @ g).max())
        else:
            G, g32 = clustered_gradients(n, p, seed=0)
            g, gamma = g32.astype(np.float64), 5e-4
        for form in args.forms:
            op = GradientOperator(G, g) if form == "gradients" else GramOperator(G @ G.T, G @ g, rank=min(n, p))
            times: dict[str, list[float]] = {"now": [], "before": []}
            out = {}
            for r in range(args.rounds):
                for name in ("now", "before")[r % 2:] + ("now", "before")[:r % 2]:
                    t, w, info = solve(op, gamma, probe if name == "now" else 0)
                    out[name] = (w, info, *certificate.penalised(op, gamma, w))
                    times[name].append(t)
                    print(f"{kind} {n}x{p} {form:<9} round {r + 1} {name:<6} {t:8.3f} s  {info['strategy']}, "
                          f"{np.count_nonzero(w)} active, KKT {out[name][2]:.1e}", flush=True)
            kkt_now, kkt_before = out["now"][2], out["before"][2]
            obj_now, obj_before = out["now"][3], out["before"][3]
            if not (max(kkt_now, kkt_before) <= 1e-6 and abs(obj_now - obj_before) <= 1e-9 * max(1.0, abs(obj_now))):
                sys.exit(f"bench/sparse_probe.py: {kind} {n}x{p} {form}: KKT {kkt_now:.1e} / {kkt_before:.1e}, "
                         f"objectives {obj_now!r} / {obj_before!r}")
            best = {v: min(t) for v, t in times.items()}
            ratio = best["before"] / best["now"]
            # the probe by itself: its cost where it gives up, free of the noise of the ADMM solve that follows it
            probe_s = min(probe_alone(op, gamma, probe) for _ in range(max(args.rounds, 3)))
            print(f"{kind} {n}x{p} {form}: now {best['now']:.3f} s ({out['now'][1]['strategy']}), before "
                  f"{best['before']:.3f} s ({out['before'][1]['strategy']}): {ratio:.2f}x; the probe alone "
                  f"{1e3 * probe_s:.1f} ms", flush=True)
            rows.append({"data": kind, "N": n, "p": p, "form": form, "gamma": gamma,
                         "now_s": [round(t, 4) for t in times["now"]],
                         "before_s": [round(t, 4) for t in times["before"]], "speedup": round(ratio, 2),
                         "probe_s": round(probe_s, 4),
                         "strategy_now": out["now"][1]["strategy"], "strategy_before": out["before"][1]["strategy"],
                         "active": int(np.count_nonzero(out["now"][0])), "kkt": max(kkt_now, kkt_before)})
    print(json.dumps({"bench": "sparse_probe", "probe_max": probe, "rounds": args.rounds, "cases": rows}))


if __name__ == "__main__":
    main()
