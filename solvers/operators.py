"""The two views of the KMM quadratic: the Gram matrix K, or the gradients G themselves (K never formed)."""

from __future__ import annotations

import numpy as np
import scipy.linalg as sla

from solvers.problem import gram_times


def cholesky_solve(c: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(L L^T)^-1 b in float64 from a lower Cholesky factor L (two LAPACK trtrs calls; faster than potrs here)."""
    y, _ = sla.lapack.get_lapack_funcs("trtrs", (c,))(c, b.astype(c.dtype), lower=1)
    x, _ = sla.lapack.get_lapack_funcs("trtrs", (c,))(c, y, lower=1, trans=1)
    return x.astype(np.float64)


class GramOperator:
    """K (N x N, PSD) and beta = G g_tar."""

    def __init__(self, K: np.ndarray, beta: np.ndarray):
        self.K = np.ascontiguousarray(K, dtype=np.float64)
        self.beta = np.asarray(beta, dtype=np.float64)
        self.diag = np.diag(self.K).copy()
        self.n = self.beta.shape[0]
        self.rank_bound = self.n

    def sub(self, A: np.ndarray) -> np.ndarray:
        """K[A, A]."""
        return self.K.take(A, axis=0).take(A, axis=1)  # two contiguous gathers: ~2x faster than np.ix_ (3.5 vs 7.2 ms, 800 of 1000)

    def apply(self, A: np.ndarray, w_A: np.ndarray) -> np.ndarray:
        """K[:, A] @ w_A (a length-N vector; K is symmetric, so rows of K are read for small supports)."""
        w = np.zeros(self.n)
        w[A] = w_A
        return gram_times(self.K, w)

    def shifted_solver(self, rho: float):
        """b -> (K + rho I)^-1 b, approximately: one float32 Cholesky factor of the N x N matrix.

        Its only user is ADMM, whose iterates only locate the support; the exact polish certifies.
        K + rho I has eigenvalues >= rho, so float32 is well conditioned enough for that.
        """
        shifted = self.K.astype(np.float32)
        shifted[np.diag_indices(self.n)] += np.float32(rho)
        c, info = sla.lapack.spotrf(shifted.T, lower=1, clean=0)  # symmetric: .T is its Fortran view
        if info != 0:
            raise np.linalg.LinAlgError(f"K + rho I is not positive definite (LAPACK spotrf info={info})")
        return lambda b: cholesky_solve(c, b)


class GradientOperator:
    """G (N x p rows = candidate gradients) and g_tar; K = G G^T is only ever formed on the active set."""

    def __init__(self, G: np.ndarray, g_tar: np.ndarray):
        self.G = np.ascontiguousarray(G, dtype=np.float64)
        self.g = np.asarray(g_tar, dtype=np.float64)
        self.beta = self.G @ self.g
        self.diag = np.einsum("ij,ij->i", self.G, self.G)
        self.n = self.G.shape[0]
        self.rank_bound = min(self.G.shape)  # a support larger than this has a singular K_AA

    def sub(self, A: np.ndarray) -> np.ndarray:
        """G_A G_A^T."""
        GA = self.G[A]
        return GA @ GA.T

    def apply(self, A: np.ndarray, w_A: np.ndarray) -> np.ndarray:
        """G (G_A^T w_A)."""
        if A.size == 0:
            return np.zeros(self.n)
        return self.G @ (w_A @ self.G[A])

    def shifted_solver(self, rho: float):
        """b -> (G G^T + rho I)^-1 b by Woodbury: one Cholesky factor of the p x p matrix rho I + G^T G."""
        p = self.G.shape[1]
        c = sla.cho_factor(rho * np.eye(p) + self.G.T @ self.G, lower=True, check_finite=False)
        G = self.G
        return lambda b: (b - G @ sla.cho_solve(c, G.T @ b, check_finite=False)) / rho
