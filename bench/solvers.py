"""KMM solver benchmark: convalue's solver vs CVXPY+OSQP (as the paper calls it) vs scikit-learn, in one run.

Clustered synthetic unit-norm gradients (many near-duplicate groups), p = 4096, both of the paper's
gammas. Prints per-case times, ratios, KKT violations, objectives and top-20 agreement, and ends
with one JSON line of the figures. convalue's ratio times its solve of a validated problem; the end-to-end
ratio adds its validation (make_problem of a K the bench formed as G G^T, formed=True: finiteness, symmetry, the
diagonal and duplicates in O(N^2), no spectral check), as CVXPY's time includes its own checks (bench/end_to_end.py
times the two together, interleaved). A second convalue row solves with tol (default 1e-6, the issue's accuracy: KKT <= 1e-6), where
dense solutions may stop ADMM early instead of polishing to round-off; the exact default is the first row.

    .venv/bin/python bench/solvers.py                      # N in 100, 1000, 5000, 20000
    .venv/bin/python bench/solvers.py --sizes 100 1000     # quicker
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
from baselines import sklearn_lasso  # bench/baselines.py, beside this script
from synthetic import clustered_gradients
from timing import timed

from convalue.solvers import kkt_violation, make_problem, solve_problem
from convalue.solvers.operators import GradientOperator
from convalue.solvers.penalised import solve_penalised


def top(w: np.ndarray, k: int = 20) -> set[int]:
    """The (at most) k highest positive scores: what a top-k selection would buy."""
    order = np.argsort(-w, kind="stable")[:k]
    return {int(i) for i in order if w[i] > 1e-9 * max(1.0, float(np.abs(w).max()))}


def agreement(a: np.ndarray, b: np.ndarray) -> float:
    """Share of the top-20 positive candidates two solutions agree on."""
    ta, tb = top(a), top(b)
    return len(ta & tb) / max(len(ta), len(tb), 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[100, 1000, 5000, 20000])
    ap.add_argument("--gammas", type=float, nargs="+", default=[5e-2, 5e-4])
    ap.add_argument("--p", type=int, default=4096)
    ap.add_argument("--cvxpy-max-n", type=int, default=1000, help="largest N given to CVXPY (dense quad_form)")
    ap.add_argument("--max-seconds", type=float, default=180.0, help="cap on convalue's solve (N > p, small gamma)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tol", type=float, default=1e-6, help="tolerance of the second convalue row (0: no such row)")
    args = ap.parse_args()

    rows = []
    warm = np.random.default_rng(0).standard_normal((8, 4))
    sklearn_lasso(warm, warm[0], warm @ warm.T, warm @ warm[0], 0.1, 10)  # import and JIT costs out of the timings
    solve_problem(make_problem(warm @ warm.T, warm @ warm[0], gamma=0.1), method="cvxpy_paper")
    print(f"{'N':>6} {'gamma':>7} {'method':<22} {'time_s':>9} {'kkt':>9} {'objective':>14} {'nnz':>6} {'top20':>6}  note")
    for n in args.sizes:
        G, g32 = clustered_gradients(n, args.p, seed=args.seed)
        t0 = time.perf_counter()
        K = (G @ G.T).astype(np.float64)
        K = 0.5 * (K + K.T)
        G64 = G.astype(np.float64)
        g = g32.astype(np.float64)
        beta = G64 @ g
        gram_s = time.perf_counter() - t0
        for gamma in args.gammas:
            # validation (make_problem) is timed apart, as the best of as many runs as the solve; CVXPY's time
            # includes its own checks, so the end-to-end ratio below adds it to convalue's
            validate_s, prob = timed(make_problem, K, beta, gamma=gamma, rank_bound=args.p, formed=True,
                                     repeat=5 if n <= 1000 else 1)
            rec = {"N": n, "gamma": gamma, "gram_s": round(gram_s, 3), "validate_s": round(validate_s, 6)}
            # convalue
            if n <= 6000 or gamma >= 0.01 * float(np.abs(beta).max()):
                repeat = 5 if n <= 1000 else 1  # millisecond solves: the best of five damps this host's noise
                t_cv, sol = timed(solve_problem, prob, method="active_set", repeat=repeat)
                w_cv, note = sol.w, sol.info.get("strategy", "")
                if sol.info.get("fallback"):
                    note += f" fallback={sol.info['fallback']}"
            else:  # N > p with a dense support: the gradient-space variant (K never factorised), time-capped
                op = GradientOperator(G64, g)
                try:
                    t_cv, (w_cv, info) = timed(solve_penalised, op, gamma, max_seconds=args.max_seconds)
                except Exception as exc:  # report the failure and go on with the other cases
                    print(f"{n:>6} {gamma:>7.0e} convalue FAILED: {type(exc).__name__}: {exc}", flush=True)
                    rows.append(rec | {"convalue_error": f"{type(exc).__name__}: {exc}"})
                    continue
                note = f"gradient-space {info['strategy']}" + (f" fallback={info['fallback']}" if info["fallback"] else "")
                if not info["converged"]:
                    note += f" NOT CONVERGED within {args.max_seconds:.0f} s"
            kkt_cv = kkt_violation(prob, w_cv)
            obj_cv = prob.objective(w_cv)
            rec |= {"convalue_s": round(t_cv, 6), "convalue_kkt": kkt_cv, "convalue_obj": obj_cv,
                    "convalue_nnz": int(np.count_nonzero(w_cv)), "convalue_note": note}
            t_tol = None
            if args.tol > 0 and n <= 6000:  # the Gram form (early stops apply there)
                t_tol, sol_tol = timed(solve_problem, prob, method="active_set", tol=args.tol, repeat=repeat)
                rec |= {"tol": args.tol, "convalue_tol_s": round(t_tol, 6), "convalue_tol_kkt": sol_tol.kkt,
                        "convalue_tol_obj": sol_tol.objective, "convalue_tol_nnz": int(np.count_nonzero(sol_tol.w)),
                        "convalue_tol_iterations": sol_tol.iterations}
            ref_w = None
            # CVXPY + OSQP as the paper calls it
            if n <= args.cvxpy_max_n:
                t_cx, sol_cx = timed(solve_problem, prob, method="cvxpy_paper", repeat=2)  # best of two (about 1 s each)
                ref_w = sol_cx.w
                rec |= {"cvxpy_s": round(t_cx, 6), "cvxpy_kkt": sol_cx.kkt, "cvxpy_obj": sol_cx.objective,
                        "speedup_vs_cvxpy": round(t_cx / t_cv, 1),
                        "speedup_end_to_end_vs_cvxpy": round(t_cx / (validate_s + t_cv), 1),
                        "top20_vs_cvxpy": agreement(w_cv, ref_w)}
                if t_tol is not None:
                    rec |= {"speedup_tol_vs_cvxpy": round(t_cx / t_tol, 1),
                            "speedup_tol_end_to_end_vs_cvxpy": round(t_cx / (validate_s + t_tol), 1)}
            # scikit-learn coordinate descent on the precomputed Gram
            max_iter = 1000  # sweeps; at N = 20000, gamma = 5e-4 this is about 40 s and still short of KKT 1e-6
            t_sk, (w_sk, conv_sk) = timed(sklearn_lasso, G64, g, K, beta, gamma, max_iter)
            rec |= {"sklearn_s": round(t_sk, 6), "sklearn_kkt": kkt_violation(prob, w_sk),
                    "sklearn_obj": prob.objective(w_sk), "sklearn_converged": conv_sk, "sklearn_max_iter": max_iter,
                    "speedup_vs_sklearn": round(t_sk / t_cv, 1),
                    "top20_vs_sklearn": agreement(w_cv, w_sk)}
            rows.append(rec)
            print(f"{n:>6} {gamma:>7.0e} {'convalue':<22} {t_cv:>9.4f} {kkt_cv:>9.1e} {obj_cv:>14.9f} "
                  f"{rec['convalue_nnz']:>6} {'':>6}  {note}")
            if t_tol is not None:
                vs = (f"; convalue at tol is {rec['speedup_tol_vs_cvxpy']}x faster than cvxpy "
                      f"({rec['speedup_tol_end_to_end_vs_cvxpy']}x with its validation)") if "cvxpy_s" in rec else ""
                print(f"{n:>6} {gamma:>7.0e} {f'convalue tol={args.tol:g}':<22} {t_tol:>9.4f} {sol_tol.kkt:>9.1e} "
                      f"{sol_tol.objective:>14.9f} {rec['convalue_tol_nnz']:>6} {'':>6}  "
                      f"{sol_tol.iterations} iterations, {'early stop' if sol_tol.info.get('early_stop') else 'exact'}{vs}")
            if "cvxpy_s" in rec:
                print(f"{n:>6} {gamma:>7.0e} {'cvxpy+osqp (paper)':<22} {rec['cvxpy_s']:>9.4f} {rec['cvxpy_kkt']:>9.1e} "
                      f"{rec['cvxpy_obj']:>14.9f} {int(np.count_nonzero(np.abs(ref_w) > 1e-9)):>6} "
                      f"{rec['top20_vs_cvxpy']:>6.2f}  convalue is {rec['speedup_vs_cvxpy']}x faster "
                      f"({rec['speedup_end_to_end_vs_cvxpy']}x with its validation, {validate_s * 1e3:.3f} ms)")
            print(f"{n:>6} {gamma:>7.0e} {'sklearn enet_path':<22} {t_sk:>9.4f} {rec['sklearn_kkt']:>9.1e} "
                  f"{rec['sklearn_obj']:>14.9f} {int(np.count_nonzero(w_sk)):>6} {rec['top20_vs_sklearn']:>6.2f}  "
                  f"{'converged' if conv_sk else f'NOT converged (max_iter={max_iter})'}; "
                  f"convalue is {rec['speedup_vs_sklearn']}x faster", flush=True)
    summary = {"bench": "solvers", "p": args.p, "results": rows}
    print(json.dumps(summary, default=float))


if __name__ == "__main__":
    main()
