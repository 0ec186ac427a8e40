"""Validation of a large Gram K beyond the pivoted Cholesky's reach, as make_problem now runs it and before.

Clustered synthetic unit-norm gradients (bench/synthetic.py), K = G G^T of rank p < N, in one process:
  symmetrise   convalue.solvers.problem.symmetrised (square tiles) against whole-matrix max|K|, K - K^T and 0.5 (K + K^T):
               seconds and the peak memory allocated beyond K (tracemalloc), and the results compared exactly
  lambda_min   convalue.solvers.problem.ritz_floor (LOBPCG, a fixed block and number of iterations) against the former
               ARPACK call (eigsh k=1 "SA", tol 1e-4, maxiter 300; no converged value counted as 0), on K and on
               K plus symmetric noise of --noise (a cluster of negative eigenvalues, as from low-precision
               gradients): seconds and the value each reports (validation refuses K when it is below -1e-6 max|K|)
  total        make_problem(K, beta, rank_bound=p) as the pipeline calls it (p = 8192 is its default dimension,
               which puts every N > 7813 beyond the pivoted Cholesky)
Prints each pair with its ratio and ends with one JSON line.

    .venv/bin/python bench/validation.py [--n 10000 --p 8192 --noise 1e-4] [--no-noise]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np

# the repository root first (bench/solvers.py is named like the package), bench/ last
sys.path[0] = str(Path(__file__).resolve().parents[1])
sys.path.append(str(Path(__file__).resolve().parent))

from synthetic import clustered_gradients  # noqa: E402

from convalue.solvers import make_problem  # noqa: E402
from convalue.solvers.problem import ritz_floor, symmetrised  # noqa: E402


def former_symmetrised(K: np.ndarray, sym_tol: float = 1e-6) -> tuple[np.ndarray, float]:
    """The former whole-matrix check and symmetrisation: (0.5 (K + K^T), max|K|)."""
    scale = max(float(np.abs(K).max()), 1e-300)
    asym = float(np.abs(K - K.T).max())
    if asym > sym_tol * scale:
        raise ValueError(f"K is not symmetric: {asym:.3g}")
    return 0.5 * (K + K.T), scale


def former_lambda_min(K: np.ndarray) -> float:
    """The former ARPACK estimate of lambda_min (0.0 when nothing converged, as validation counted it)."""
    from scipy.sparse.linalg import ArpackNoConvergence, eigsh

    try:
        return float(eigsh(K, k=1, which="SA", tol=1e-4, maxiter=300, return_eigenvectors=False)[0])
    except ArpackNoConvergence as exc:
        vals = exc.eigenvalues
        return float(vals.min()) if len(vals) else 0.0


def noisy(K: np.ndarray, scale: float, seed: int) -> np.ndarray:
    """K plus symmetric Gaussian noise with entries of about `scale`: a cluster of negative eigenvalues."""
    M = np.random.default_rng(seed).standard_normal(K.shape) * scale
    M += M.T
    M *= 0.5
    M += K
    return M


def measured(fn, *args, peak: bool = False):
    """(seconds, peak MB allocated during the call or None, result); the peak from a second, traced call (tracing
    slows the call it watches)."""
    t0 = time.perf_counter()
    out = fn(*args)
    seconds = time.perf_counter() - t0
    if not peak:
        return seconds, None, out
    del out
    tracemalloc.start()
    out = fn(*args)
    mb = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    return seconds, mb, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=10000)
    ap.add_argument("--p", type=int, default=8192)
    ap.add_argument("--noise", type=float, default=1e-4, help="entry scale of the symmetric noise added to K")
    ap.add_argument("--no-noise", action="store_true", help="skip the indefinite case (saves the slowest timing)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if not 0 < args.p < args.n:
        ap.error("the bench needs 0 < p < N")

    G, g32 = clustered_gradients(args.n, args.p, seed=args.seed)
    K = G @ G.T  # float64, as engine/gram.py reduces it
    beta = G @ g32.astype(np.float64)
    del G
    rec: dict = {"bench": "validation", "N": args.n, "p": args.p, "K_mb": round(K.nbytes / 2**20)}

    t_old, m_old, (S_old, _) = measured(former_symmetrised, K, peak=True)
    t_new, m_new, (S_new, _) = measured(symmetrised, K, 1e-6, peak=True)
    same = bool(np.array_equal(S_old, S_new))
    del S_old, S_new
    rec |= {"sym_former_s": round(t_old, 2), "sym_former_peak_mb": round(m_old), "sym_s": round(t_new, 2),
            "sym_peak_mb": round(m_new), "sym_identical": same, "sym_speedup": round(t_old / max(t_new, 1e-9), 2)}
    print(f"symmetrise  tiles {t_new:.2f} s, {m_new:.0f} MB beyond K; whole-matrix {t_old:.2f} s, {m_old:.0f} MB "
          f"({rec['sym_speedup']}x, results {'identical' if same else 'DIFFERENT'})", flush=True)

    cases = [("psd", K)] + ([] if args.no_noise else [("noisy", noisy(K, args.noise, args.seed + 1))])
    for name, M in cases:
        t_new, _, v_new = measured(ritz_floor, M)
        t_old, _, v_old = measured(former_lambda_min, M)
        rec |= {f"{name}_lobpcg_s": round(t_new, 2), f"{name}_lobpcg_value": v_new,
                f"{name}_arpack_s": round(t_old, 2), f"{name}_arpack_value": v_old,
                f"{name}_speedup": round(t_old / max(t_new, 1e-9), 1)}
        print(f"lambda_min  {name}: LOBPCG {t_new:.2f} s -> {v_new:.3e}; ARPACK {t_old:.2f} s -> {v_old:.3e} "
              f"({rec[f'{name}_speedup']}x)", flush=True)
    del cases, M  # the noisy copy

    t0 = time.perf_counter()
    prob = make_problem(K, beta, gamma=5e-4, rank_bound=args.p)
    rec |= {"make_problem_s": round(time.perf_counter() - t0, 2), "rank": prob.rank}
    print(f"make_problem(rank_bound={args.p}): {rec['make_problem_s']:.2f} s, rank {prob.rank}", flush=True)
    print(json.dumps(rec, default=float))


if __name__ == "__main__":
    main()
