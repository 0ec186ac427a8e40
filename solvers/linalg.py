"""Dense support-system solves K_AA x = rhs: Cholesky (float32 factor refined to float64 when large), least squares when singular."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import scipy.linalg as sla

_TRTRS = {np.dtype(np.float32): sla.lapack.strtrs, np.dtype(np.float64): sla.lapack.dtrtrs}

#: numpy's X @ X.T calls OpenBLAS's threaded syrk, which segfaults on large X (numpy#19685): measured here with
#: numpy's OpenBLAS 0.3.31 and scipy's 0.3.30, SkylakeX and Haswell kernels, two threads, from 16,000 x 1024
#: float64 rows (14,000 x 512 and 20,000 x 1024 on one thread run). Panels of this many rows stay clear of it.
SELF_GRAM_PANEL = 4096


def self_gram(X: np.ndarray, panel: int = SELF_GRAM_PANEL) -> np.ndarray:
    """X X^T, exactly symmetric: numpy's X @ X.T up to `panel` rows (bit for bit), else each panel's own product
    and its products with the panels below (general matrix products), mirrored below the diagonal."""
    n = X.shape[0]
    if n <= panel:
        return X @ X.T
    K = np.empty((n, n), dtype=np.result_type(X.dtype, np.float32))
    for i in range(0, n, panel):
        Xi = X[i:i + panel]
        K[i:i + panel, i:i + panel] = Xi @ Xi.T
        if i + panel < n:
            rows = Xi @ X[i + panel:].T  # two buffers: a general product, never syrk
            K[i:i + panel, i + panel:] = rows
            K[i + panel:, i:i + panel] = rows.T
    return K


def cholesky_solve(c: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(L L^T)^-1 b in float64 from a lower Cholesky factor L (two LAPACK trtrs calls; faster than potrs here)."""
    trtrs = _TRTRS[c.dtype]
    y, _ = trtrs(c, b.astype(c.dtype), lower=1)
    x, _ = trtrs(c, y, lower=1, trans=1)
    return x.astype(np.float64)


def mixed_precision_solve(Kaa32: np.ndarray, rhs: np.ndarray, matvec: Callable[[np.ndarray], np.ndarray],
                          steps: int = 4) -> np.ndarray | None:
    """x with ||rhs - K_AA x|| <= 1e-13 ||rhs|| from a float32 Cholesky of Kaa32 (factored in place: callers pass a
    temporary) refined with the float64 matvec(x) = K_AA x, or None when float32 cannot get there (K_AA too
    ill-conditioned)."""
    # K_AA symmetric: .T is its Fortran view; in place, f2py makes no second copy of it (4 |A|^2 bytes)
    c, info = sla.lapack.spotrf(Kaa32.T, lower=1, clean=0, overwrite_a=1)
    if info != 0:
        return None
    diag = np.abs(np.diag(c)).astype(np.float64) ** 2
    if diag.min() <= 1e-6 * diag.max():  # near-singular in float32: refinement would stall
        return None
    target = 1e-13 * float(np.linalg.norm(rhs))
    x = np.zeros_like(rhs, dtype=np.float64)
    r = rhs
    for _ in range(steps):
        x = x + cholesky_solve(c, r)
        r = rhs - matvec(x)
        if float(np.linalg.norm(r)) <= target:
            return x
    return None


def solve_dense(Kaa: np.ndarray, rhs: np.ndarray, *, mixed_min_n: int | None) -> np.ndarray:
    """Solve K_AA x = rhs: Cholesky, or the minimum-norm least-squares solution if K_AA is singular.

    Systems of at least mixed_min_n (None: none) first try a float32 factor refined to float64 accuracy (about 2x
    faster); when that declines, the float64 factor is used.
    """
    if mixed_min_n is not None and Kaa.shape[0] >= mixed_min_n:
        x = mixed_precision_solve(Kaa.astype(np.float32), rhs, lambda v: Kaa @ v)
        if x is not None:
            return x
    scale = float(np.max(np.diag(Kaa))) if Kaa.size else 1.0
    try:
        c, low = sla.cho_factor(Kaa, lower=True, check_finite=False)
        if float(np.min(np.abs(np.diag(c)))) ** 2 > 1e-11 * scale:
            return sla.cho_solve((c, low), rhs, check_finite=False)
    except np.linalg.LinAlgError:
        pass
    # rank-deficient support (duplicated candidates, N > p): any solution is optimal; take the min-norm one
    try:
        return sla.lstsq(Kaa, rhs, cond=1e-12, lapack_driver="gelsd", check_finite=False)[0]
    except np.linalg.LinAlgError:  # the SVD can fail to converge on large singular supports
        return sla.lstsq(Kaa, rhs, cond=1e-12, lapack_driver="gelsy", check_finite=False)[0]
