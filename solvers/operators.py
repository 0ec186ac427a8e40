"""The two views of the KMM quadratic: the Gram matrix K, or the gradients G themselves (K formed on active sets)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import scipy.linalg as sla

from convalue.solvers.linalg import cholesky_solve, mixed_precision_solve, self_gram, solve_dense
from convalue.solvers.policy import DEFAULT_POLICY, LinalgPolicy
from convalue.solvers.problem import gram_times


def _principal(M: np.ndarray, A: np.ndarray) -> np.ndarray:
    """M[A, A] by two contiguous gathers (about twice as fast as np.ix_)."""
    return M.take(A, axis=0).take(A, axis=1)


def _gram_reusing(G: np.ndarray, A: np.ndarray, last: tuple[np.ndarray, np.ndarray] | None,
                  dtype: type | None = None) -> np.ndarray:
    """G[A] G[A]^T as a new array (rows cast to dtype first, when given); where last = (B, G[B] G[B]^T) shares at
    least half of A, the shared block is copied from it and only the new candidates' rows are products."""
    GA = G[A] if dtype is None else G[A].astype(dtype)
    if last is not None:
        B, KBB = last
        where = np.full(G.shape[0], -1)
        where[B] = np.arange(B.size)
        loc = where[A]
        shared, fresh = np.flatnonzero(loc >= 0), np.flatnonzero(loc < 0)
        if 2 * shared.size >= A.size:
            K = np.empty((A.size, A.size), dtype=GA.dtype)
            K[np.ix_(shared, shared)] = _principal(KBB, loc[shared])
            if fresh.size:
                Gf = GA[fresh]
                rows = Gf @ GA.T
                rows[:, fresh] = self_gram(Gf)  # exactly symmetric, as the whole matrix stays
                K[fresh] = rows
                K[:, fresh] = rows.T
            return K
    return self_gram(GA)


class GramOperator:
    """K (N x N, PSD) and beta = G g_tar; rank, when known, bounds the size of a nonsingular support; linalg: the
    policy's section for its support solves and kept copies."""

    def __init__(self, K: np.ndarray, beta: np.ndarray, rank: int | None = None, *,
                 linalg: LinalgPolicy = DEFAULT_POLICY.linalg):
        self.linalg = linalg
        self.K = np.ascontiguousarray(K, dtype=np.float64)
        self.beta = np.asarray(beta, dtype=np.float64)
        self.diag = np.diag(self.K).copy()
        self.n = self.beta.shape[0]
        self.rank_bound = self.n if rank is None else int(rank)
        self._K32: np.ndarray | None = None

    def float32_copy(self) -> np.ndarray | None:
        """K in float32, made once and kept up to the policy's float32_copy_max_n (None above: half of K again is too
        much)."""
        if self._K32 is None and self.n <= self.linalg.float32_copy_max_n:
            self._K32 = self.K.astype(np.float32)
        return self._K32

    def sub(self, A: np.ndarray) -> np.ndarray:
        """K[A, A]."""
        return _principal(self.K, A)

    def solve_support(self, A: np.ndarray, rhs: np.ndarray) -> np.ndarray:
        """x with K_AA x = rhs (rhs: |A| or |A| x k).

        Large supports gather K_AA from the float32 copy (half the bytes of the float64 gather) and refine
        with float64 products K w (the whole K, or its rows on A when A is under a third of N), which cost
        less than gathering K_AA in float64.
        """
        return self._solve_support(A, rhs)[0]

    def solve_support_residual(self, A: np.ndarray, rhs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(x, r): x with K_AA x = rhs (a vector) and r = K w - beta for w = x on A, 0 elsewhere.

        When the solve is refined, its last refinement product is K w itself, so r costs no extra product.
        """
        x, product = self._solve_support(A, rhs)
        if product is None:
            product = self.apply(A, x)
        return x, product - self.beta

    def _solve_support(self, A: np.ndarray, rhs: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """(x, K w for w = x on A when the refinement's last product is that, else None)."""
        mixed = self.linalg.mixed_min_n
        K32 = self.float32_copy() if A.size >= mixed else None
        if K32 is None:
            return solve_dense(self.sub(A), rhs, mixed_min_n=mixed), None
        last: dict = {}

        def matvec(x: np.ndarray) -> np.ndarray:
            full = np.zeros((self.n,) + x.shape[1:])
            full[A] = x
            # rows of K on the support when it is small against N (gram_times); full length either way
            product = gram_times(self.K, full) if x.ndim == 1 else self.K @ full
            last["x"], last["product"] = x, product
            return product[A]

        x = mixed_precision_solve(_principal(K32, A), rhs, matvec)
        if x is None:
            return solve_dense(self.sub(A), rhs, mixed_min_n=None), None
        return x, (last["product"] if last.get("x") is x else None)

    def restricted(self, A: np.ndarray) -> GramOperator:
        """The operator of the candidates A only (K_AA, beta_A)."""
        return GramOperator(self.sub(A), self.beta[A], rank=min(self.rank_bound, A.size), linalg=self.linalg)

    def apply(self, A: np.ndarray, w_A: np.ndarray) -> np.ndarray:
        """K[:, A] @ w_A (a length-N vector; K is symmetric, so rows of K are read for small supports)."""
        w = np.zeros(self.n)
        w[A] = w_A
        return gram_times(self.K, w)

    def shifted_solver(self, rho: float, *, keep_copy: bool = True) -> Callable[[np.ndarray], np.ndarray]:
        """b -> (K + rho I)^-1 b, approximately: one float32 Cholesky factor of the N x N matrix.

        Its only user is ADMM, whose iterates locate the support (the exact polish certifies) or, stopped early,
        meet a tolerance checked in float64. K + rho I has eigenvalues >= rho, so float32 is well conditioned enough
        for that. keep_copy=False casts K straight into the factor's buffer where no float32 copy is kept yet (one
        pass over K instead of two; for an ADMM that expects no polish, whose support solves read that copy).
        The solver's `lambda_min_bound` is an upper bound on K's smallest eigenvalue, from the factor's pivots.
        """
        K32 = self.float32_copy() if keep_copy or self._K32 is not None else None
        shifted = K32.copy() if K32 is not None else self.K.astype(np.float32)
        shifted[np.diag_indices(self.n)] += np.float32(rho)
        c, info = sla.lapack.spotrf(shifted.T, lower=1, clean=0, overwrite_a=1)  # symmetric: .T is its Fortran view
        if info != 0:
            raise np.linalg.LinAlgError(f"K + rho I is not positive definite (LAPACK spotrf info={info})")

        def solve(b: np.ndarray) -> np.ndarray:
            return cholesky_solve(c, b)

        # every Cholesky pivot L_ii^2 is at least the smallest eigenvalue, so this bounds lambda_min(K) from above
        solve.lambda_min_bound = float(np.min(np.diag(c)).astype(np.float64) ** 2) - rho
        return solve


class GradientOperator:
    """G (N x p rows = candidate gradients) and g_tar; K = G G^T is only ever formed on the active set.

    Large support systems cast the support's rows to float32 (never all of G: at N = 100,000 a float32 copy is
    3.3 GB more) and keep the last large support's float32 matrix (4 |A|^2 bytes): a float32 product costs half a
    float64 one, and the solve is refined to float64 accuracy; sub() keeps a float64 matrix likewise. linalg: as
    for GramOperator.
    """

    def __init__(self, G: np.ndarray, g_tar: np.ndarray, *, linalg: LinalgPolicy = DEFAULT_POLICY.linalg):
        self.linalg = linalg
        self.G = np.ascontiguousarray(G, dtype=np.float64)
        self.g = np.asarray(g_tar, dtype=np.float64)
        self.beta = self.G @ self.g
        self.diag = np.einsum("ij,ij->i", self.G, self.G)
        self.n = self.G.shape[0]
        self.rank_bound = min(self.G.shape)  # a support larger than this has a singular K_AA
        self._last32: tuple[np.ndarray, np.ndarray] | None = None  # (A, G_A G_A^T in float32): the last large support
        self._last64: tuple[np.ndarray, np.ndarray] | None = None  # (A, G_A G_A^T): sub()'s kept matrix

    def sub(self, A: np.ndarray) -> np.ndarray:
        """G_A G_A^T (float64, a new array), reusing the kept matrix where the two share at least half of A: the
        NNLS polish asks for nested equicorrelation sets, and for about the same ones at every failed polish. A set
        under half the kept one's size does not replace it (the small supports solved between two polishes), nor does
        one above the policy's sub_keep_max_n (the NNLS polish's largest set)."""
        K = _gram_reusing(self.G, A, self._last64)
        if A.size <= self.linalg.sub_keep_max_n and (self._last64 is None or 2 * A.size >= self._last64[0].size):
            self._last64 = (np.array(A, copy=True), K.copy())
        return K

    def solve_support(self, A: np.ndarray, rhs: np.ndarray) -> np.ndarray:
        """x with G_A G_A^T x = rhs (rhs: |A| or |A| x k).

        Large supports factor G_A G_A^T formed in float32 and refine with the float64 product G_A (G_A^T x)
        (2 |A| p flops, against |A|^2 p to form the float64 matrix); where float32 cannot get there, the float64
        matrix is formed and solved as before.
        """
        mixed = self.linalg.mixed_min_n
        if A.size >= mixed:
            GA = self.G[A]
            x = mixed_precision_solve(self.support_gram32(A), rhs, lambda v: GA @ (GA.T @ v))
            if x is not None:
                return x
            return solve_dense(self.sub(A), rhs, mixed_min_n=None)
        return solve_dense(self.sub(A), rhs, mixed_min_n=mixed)

    def support_gram32(self, A: np.ndarray) -> np.ndarray:
        """G_A G_A^T in float32, a new array (the caller may overwrite it), reusing the last large support's matrix
        where the two share at least half of A (successive polishes and PDAS steps move a few candidates)."""
        K = _gram_reusing(self.G, A, self._last32, np.float32)
        self._last32 = (np.array(A, copy=True), K.copy())
        return K

    def solve_support_residual(self, A: np.ndarray, rhs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(x, r): x with G_A G_A^T x = rhs (a vector) and r = K w - beta for w = x on A, 0 elsewhere."""
        x = self.solve_support(A, rhs)
        return x, self.apply(A, x) - self.beta

    def gram(self) -> GramOperator:
        """The same problem in the Gram form: K = G G^T formed (N^2 p flops, exactly symmetric), the same beta."""
        return GramOperator(self.G @ self.G.T, self.beta, rank=self.rank_bound, linalg=self.linalg)

    def restricted(self, A: np.ndarray) -> GradientOperator:
        """The operator of the candidates A only (their gradients G_A, the same g_tar)."""
        return GradientOperator(self.G[A], self.g, linalg=self.linalg)

    def apply(self, A: np.ndarray, w_A: np.ndarray) -> np.ndarray:
        """G (G_A^T w_A)."""
        if A.size == 0:
            return np.zeros(self.n)
        return self.G @ (w_A @ self.G[A])

    def shifted_solver(self, rho: float) -> Callable[[np.ndarray], np.ndarray]:
        """b -> (G G^T + rho I)^-1 b by Woodbury: one Cholesky factor of the p x p matrix rho I + G^T G.

        It stays float64: a float32 factor of rho I + G^T G cost ADMM several times the iterations on near-parallel
        gradients, and no residual threshold told those cases from the ones it sped up.
        """
        p = self.G.shape[1]
        c = sla.cho_factor(rho * np.eye(p) + self.G.T @ self.G, lower=True, check_finite=False)
        G = self.G
        return lambda b: (b - G @ sla.cho_solve(c, G.T @ b, check_finite=False)) / rho
