"""Sparse solutions where plain PDAS straight at gamma fails: the current chain against the former one.

solve_penalised sends sparse solutions (gamma >= 1 % of max|beta|) to plain PDAS straight at gamma. Where that
fails (it diverges at small gammas, or its first support exceeds the rank when N > p), the former chain ran all
15 PDAS steps and then PDAS with gamma continuation. Now PDAS stops after two objective increases in a row, and
the homotopy on a working set grown by KKT violators runs first where supports can outgrow the rank (N > p)
and in the gradient form (where every support system forms G_A G_A^T); on a full-rank Gram PDAS and then
continuation still go first, and the working set comes third. On clustered synthetic unit-norm gradients (bench/synthetic.py), in one process, interleaved,
best of --repeats, for the Gram and the gradient operator: time, KKT violation and strategy of both, and the
ratio. Per case it also runs plain PDAS from zero with and without the divergence stop once (does the stop ever
cut a run that converges? how many support solves does it save?), and with --starts it times the working-set
homotopy alone for each size of its first set. Ends with one JSON line.

    .venv/bin/python bench/sparse_chain.py [--cases 1000x4096 2000x4096 5000x4096 5000x1000] [--gammas 5e-2 2e-2 1e-2]
    .venv/bin/python bench/sparse_chain.py --starts 64 128 256     # and the first set's size
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from pathlib import Path

import numpy as np

# the repository root first (bench/solvers.py is named like the package), bench/ last
sys.path[0] = str(Path(__file__).resolve().parents[1])
sys.path.append(str(Path(__file__).resolve().parent))

from synthetic import case, clustered_gradients  # noqa: E402

from convalue.solvers.active_set import continuation, kkt_of, pdas_plain  # noqa: E402
from convalue.solvers.operators import GradientOperator, GramOperator  # noqa: E402
from convalue.solvers.penalised import solve_penalised  # noqa: E402
from convalue.solvers.threads import blas_threads  # noqa: E402
from convalue.solvers.working_set import working_set_homotopy  # noqa: E402


def former_chain(op, gamma: float) -> tuple[np.ndarray, str]:
    """The former sparse chain's first two links: 15 plain PDAS steps (no divergence stop), then continuation."""
    scale = 1e-10 * max(1.0, float(np.abs(op.beta).max()))
    w, _, ok = pdas_plain(op, gamma, np.zeros(op.n), 15, scale, diverging=None)
    if ok:
        return w, "pdas_direct"
    w, _, ok = continuation(op, gamma, 0.25, 200)
    return w, "pdas_continuation" if ok else "not converged (the former chain went on to ADMM)"


def stop_census(op, gamma: float) -> dict:
    """Plain PDAS from zero at gamma without and with the divergence stop: converged?, support solves made."""
    scale = 1e-10 * max(1.0, float(np.abs(op.beta).max()))
    _, solves_all, ok_all = pdas_plain(op, gamma, np.zeros(op.n), 15, scale, diverging=None)
    _, solves_stop, ok_stop = pdas_plain(op, gamma, np.zeros(op.n), 15, scale)
    return {"converged_without_stop": ok_all, "converged_with_stop": ok_stop,
            "solves_without_stop": solves_all, "solves_with_stop": solves_stop}


def working_set_alone(op, gamma: float, *, start: int) -> tuple[np.ndarray, bool]:
    """The working-set homotopy by itself, its first set of `start` candidates; (w, converged)."""
    w, _, ok = working_set_homotopy(op, gamma, 1e-10 * max(1.0, float(np.abs(op.beta).max())), start=start)
    return w, ok


def current_chain(op, gamma: float) -> tuple[np.ndarray, str]:
    """solve_penalised as it is now."""
    w, info = solve_penalised(op, gamma)
    return w, info["strategy"] + (f" fallback={info['fallback']}" if info["fallback"] else "")


def best_of(fn, op, gamma: float, repeats: int) -> tuple[float, np.ndarray, str]:
    """(best seconds, w, strategy) of fn(op, gamma) under the BLAS limit solve_kmm uses."""
    best, out = float("inf"), None
    for _ in range(repeats):
        with blas_threads(op.n):
            t0 = time.perf_counter()
            out = fn(op, gamma)
            best = min(best, time.perf_counter() - t0)
    return best, out[0], out[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=case, nargs="+", default=[(1000, 4096), (2000, 4096), (5000, 4096), (5000, 1000)])
    ap.add_argument("--gammas", type=float, nargs="+", default=[5e-2, 2e-2, 1e-2])
    ap.add_argument("--forms", nargs="+", choices=("gram", "gradients"), default=["gram", "gradients"])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--starts", type=int, nargs="*", default=[],
                    help="also time the working-set homotopy alone for each size of its first set")
    args = ap.parse_args()

    warm = GramOperator(np.eye(4) + 0.1, np.arange(1.0, 5.0))
    working_set_homotopy(warm, 0.5, 1e-10)  # imports and first calls (scikit-learn's LARS) out of the timings
    rows = []
    print(f"{'N':>6} {'p':>5} {'gamma':>7} {'form':<9} {'former_s':>9} {'now_s':>9} {'ratio':>7} "
          f"{'kkt_former':>10} {'kkt_now':>9}  strategies (former -> now)")
    for n, p in args.cases:
        G, g = clustered_gradients(n, p, seed=0)
        G64, g64 = G.astype(np.float64), g.astype(np.float64)
        ops = {}
        if "gram" in args.forms:
            K = G64 @ G64.T
            ops["gram"] = GramOperator(0.5 * (K + K.T), G64 @ g64, rank=min(n, p))
            del K
        if "gradients" in args.forms:
            ops["gradients"] = GradientOperator(G64, g64)
        for gamma in args.gammas:
            for form, op in ops.items():
                t_old, w_old, s_old = best_of(former_chain, op, gamma, args.repeats)
                t_new, w_new, s_new = best_of(current_chain, op, gamma, args.repeats)
                k_old, k_new = kkt_of(op, gamma, w_old), kkt_of(op, gamma, w_new)
                rec = {"N": n, "p": p, "gamma": gamma, "form": form, "former_s": round(t_old, 4),
                       "now_s": round(t_new, 4), "ratio": round(t_old / t_new, 2), "kkt_former": k_old,
                       "kkt_now": k_new, "strategy_former": s_old, "strategy_now": s_new,
                       "nnz": int(np.count_nonzero(w_new))}
                rec |= stop_census(op, gamma)
                for start in args.starts:
                    t_ws, _, ok = best_of(functools.partial(working_set_alone, start=start), op, gamma, args.repeats)
                    rec.setdefault("start_s", {})[start] = round(t_ws, 4) if ok else None
                rows.append(rec)
                print(f"{n:>6} {p:>5} {gamma:>7.0e} {form:<9} {t_old:>9.4f} {t_new:>9.4f} {rec['ratio']:>6.2f}x "
                      f"{k_old:>10.1e} {k_new:>9.1e}  {s_old} -> {s_new}"
                      + (f"  first set {rec['start_s']}" if args.starts else ""), flush=True)
    ratios = np.array([r["ratio"] for r in rows])
    summary = {"bench": "sparse_chain", "cases": len(rows),
               "geomean_ratio": round(float(np.exp(np.log(ratios).mean())), 2) if rows else None,
               "slower_cases": int((ratios < 1).sum()),
               # runs that converge without the stop but not with it: the stop's only possible harm
               "stop_cut_converging": sum(r["converged_without_stop"] and not r["converged_with_stop"] for r in rows),
               "stop_converging_runs": sum(r["converged_without_stop"] for r in rows),
               "failing_solves_without_stop": sum(r["solves_without_stop"] for r in rows
                                                  if not r["converged_without_stop"]),
               "failing_solves_with_stop": sum(r["solves_with_stop"] for r in rows if not r["converged_without_stop"]),
               "results": rows}
    print(f"geometric mean: {summary['geomean_ratio']}x faster; slower in {summary['slower_cases']} of {len(rows)}")
    print(f"plain PDAS from zero: {summary['stop_converging_runs']} of {len(rows)} runs converge without the "
          f"divergence stop, {summary['stop_cut_converging']} of them not with it; the failing runs made "
          f"{summary['failing_solves_without_stop']} support solves without it, {summary['failing_solves_with_stop']} "
          f"with it")
    for start in args.starts:
        times = [r["start_s"][start] for r in rows]
        done = [t for t in times if t is not None]
        fastest = sum(t is not None and t == min(v for v in r["start_s"].values() if v is not None)
                      for t, r in zip(times, rows))
        summary.setdefault("start_geomean_s", {})[start] = (round(float(np.exp(np.log(done).mean())), 4)
                                                             if done else None)
        print(f"working set first {start}: geometric mean {summary['start_geomean_s'][start]} s over "
              f"{len(done)} certified cases, fastest in {fastest}")
    print(json.dumps(summary, default=float))


if __name__ == "__main__":
    main()
