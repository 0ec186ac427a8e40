"""The KMM problem (paper eq. kmm_l1_penalized / kmm_qp) and its input validation."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np
import scipy.linalg as sla
from scipy.sparse.linalg import lobpcg

from convalue.solvers.homotopy import representatives
from convalue.solvers.policy import DEFAULT_POLICY, SolverPolicy, ValidationPolicy
from convalue.solvers.threads import blas_threads


def gram_times(K: np.ndarray, w: np.ndarray) -> np.ndarray:
    """K @ w reading only the rows of w's support (K is symmetric): O(N |support|).

    Above a third of N one full matvec is cheaper than gathering the rows.
    """
    support = np.flatnonzero(w)
    if 3 * support.size > len(w):
        return K @ w
    return w[support] @ K[support]


def objective_from_residual(w: np.ndarray, r: np.ndarray, beta: np.ndarray, penalty: float = 0.0) -> float:
    """0.5 w'Kw - beta'w + penalty from the residual r = K w - beta, without a product: 0.5 w'(r - beta)."""
    return 0.5 * float(w @ (r - beta)) + penalty


class KMMInputError(ValueError):
    """Raised when K, beta or the solver settings are not a valid KMM problem."""


class KMMSolveError(RuntimeError):
    """Raised when a solver does not reach an optimal solution."""


@dataclass(frozen=True)
class KMMProblem:
    """min_w 0.5 w'Kw - beta'w + gamma sum_i c_i |w_i| (penalised) or s.t. sum_i c_i |w_i| <= budget.

    costs c default to 1 (the paper's ||w||_1); with prices it is the marketplace's cost-weighted budget.
    rank is K's numerical rank when validation computed it (a Cholesky factor, or eigvalsh where no factor certifies
    K, within the policy's validation limits), capped by the caller's rank_bound; otherwise that bound (an upper
    bound; for a K formed by the caller, also the count of distinct candidates), else None (unknown).
    checks: what validation did (make_problem): "psd" names the check that certified K positive semidefinite
    ("formed": none, the caller formed K as G G^T; "cholesky", "pivoted_cholesky", "eigvalsh", "lobpcg_estimate";
    "skipped" where check_psd was off), "spectral" whether any O(N^3) or iterative spectral work ran, "rank" where
    the rank came from ("computed", "bound", "distinct" or None), "duplicates" the candidates that duplicate another
    where they were counted.
    """

    K: np.ndarray
    beta: np.ndarray
    gamma: float | None = None
    budget: float | None = None
    costs: np.ndarray | None = None
    rank: int | None = None
    checks: dict = field(default_factory=dict, compare=False)

    @property
    def form(self) -> str:
        """'penalised', 'budget' or 'cost_budget'."""
        if self.gamma is not None:
            return "penalised"
        return "budget" if self.costs is None else "cost_budget"

    def l1(self, w: np.ndarray) -> float:
        """sum_i c_i |w_i|."""
        return float(np.abs(w).sum() if self.costs is None else (self.costs * np.abs(w)).sum())

    @property
    def n(self) -> int:
        """Number of candidates N."""
        return int(self.beta.shape[0])

    def objective(self, w: np.ndarray) -> float:
        """Objective value at w (the l1 term is included only in the penalised form)."""
        quad = 0.5 * float(w @ gram_times(self.K, w)) - float(self.beta @ w)
        if self.gamma is not None:
            quad += self.gamma * self.l1(w)
        return quad

    def unit_cost(self) -> tuple[KMMProblem, np.ndarray]:
        """The equivalent unit-cost problem in v = c * w, and c (ones when there are no costs)."""
        if self.costs is None:
            return self, np.ones(self.n)
        c = self.costs
        return KMMProblem(K=self.K / np.outer(c, c), beta=self.beta / c, gamma=self.gamma, budget=self.budget,
                          rank=self.rank, checks=self.checks), c  # a positive diagonal scaling keeps the rank


def _pivoted_facts(K: np.ndarray, tol: float, floor: float) -> tuple[float, int] | None:
    """(a lower bound >= -tol on lambda_min(K), K's numerical rank) from a pivoted Cholesky, or None when it
    cannot certify K PSD within tol.

    LAPACK's pstrf stops once every remaining pivot is below floor, leaving P K P^T = L L^T + (0 + S) with S the
    Schur complement of the unfactored candidates. By Weyl, lambda_min(K) >= -||S||_2 >= -||S||_F, so ||S||_F <= tol
    certifies PSD-ness, and the pivots taken are the rank. Its cost falls with the rank: about N^2 rank for the
    factor and (N - rank)^2 rank for S.
    """
    c, piv, rank, info = sla.lapack.dpstrf(K, tol=floor, lower=1)
    if info < 0:
        return None
    rest, L21 = piv[rank:] - 1, c[rank:, :rank]
    sq = 0.0
    for lo in range(0, rest.size, 1024):  # S 1024 rows at a time: never a second N x N array
        block = K[rest[lo:lo + 1024]][:, rest] - L21[lo:lo + 1024] @ L21.T
        sq += float(np.einsum("ij,ij->", block, block))
    bound = float(np.sqrt(sq))
    return (-bound, int(rank)) if bound <= tol else None


def _plain_facts(K: np.ndarray, floor: float) -> tuple[float, int] | None:
    """(0.0, N) when an unpivoted Cholesky of K succeeds with every pivot above floor (K positive definite, of full
    numerical rank), else None.

    Cholesky is backward stable: success factors K + E with ||E|| of K's round-off, far inside any PSD tolerance.
    A rank-deficient K fails at about the step past its rank, which is paid for before the pivoted Cholesky runs.
    """
    c, info = sla.lapack.dpotrf(K, lower=1, clean=0)
    if info != 0:
        return None
    return (0.0, K.shape[0]) if float(np.min(np.diag(c) ** 2)) > floor else None


def ritz_floor(K: np.ndarray, policy: ValidationPolicy) -> float:
    """The smallest Ritz value of K after a fixed LOBPCG run: an upper bound on lambda_min(K), never below it."""
    n = K.shape[0]
    X = np.random.default_rng(0).standard_normal((n, min(policy.estimate_block, n)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # it stops unconverged by design: the budget bounds the cost, not the accuracy
        vals = lobpcg(K, X, largest=False, maxiter=policy.estimate_iters, tol=1e-12)[0]
    return float(np.min(vals))


def eigen_facts(K: np.ndarray, rank_rtol: float) -> tuple[float, int]:
    """(lambda_min(K), K's numerical rank: eigenvalues above rank_rtol lambda_max) from a dense eigvalsh."""
    eig = np.linalg.eigvalsh(K)
    return float(eig[0]), int(np.count_nonzero(eig > rank_rtol * max(float(eig[-1]), 0.0)))


def _spectrum_facts(K: np.ndarray, tol: float, rank_bound: int | None,
                    policy: SolverPolicy) -> tuple[float, int | None, str]:
    """(lambda_min(K), or any value >= -tol when K is PSD within tol; K's numerical rank, or None when unknown,
    which is exactly when the first is only an upper bound on lambda_min; the check's name for KMMProblem.checks).

    Within the Cholesky limits (the policy's pivoted_max_n, or beyond where the caller's rank bound puts the cost
    within pivoted_max_work): an unpivoted Cholesky certifies a full-rank K (tried unless the caller's rank bound is
    below N), else a pivoted Cholesky certifies PSD-ness and gives the rank (under the solve's BLAS thread limit).
    Where neither certifies K: up to eigvalsh_max_n, a dense eigvalsh gives the exact lambda_min (for the error
    message) and rank; beyond, a fixed-cost LOBPCG estimate, whose Ritz value never lies below lambda_min (a PSD K
    always passes; an indefinite one can slip through), and the rank stays unknown. The factors go first at every
    size: they cost a fraction of eigvalsh.
    """
    v = policy.validation
    n = K.shape[0]
    bounded = rank_bound is not None and 2.0 * n * n * min(int(rank_bound), n) <= v.pivoted_max_work
    if n <= v.pivoted_max_n or bounded:
        floor = v.rank_rtol * float(np.max(np.diag(K)))  # a pivot L_jj^2 at or below this adds nothing to the rank
        with blas_threads(n, policy.linalg.single_thread_max_n):
            # a K that may have full rank (no bound below N) tries the cheaper unpivoted Cholesky first
            facts = _plain_facts(K, floor) if rank_bound is None or int(rank_bound) >= n else None
            if facts is not None:
                return (*facts, "cholesky")
            facts = _pivoted_facts(K, tol, floor)
        if facts is not None:
            return (*facts, "pivoted_cholesky")
    if n <= v.eigvalsh_max_n:
        return (*eigen_facts(K, v.rank_rtol), "eigvalsh")
    return ritz_floor(K, v), None, "lobpcg_estimate"


def exactly_symmetric(K: np.ndarray, tile: int) -> bool:
    """True where K equals its transpose bit for bit (numpy's G @ G.T is), compared a tile pair at a time (no N x N
    temporary)."""
    n = K.shape[0]
    for i in range(0, n, tile):
        for j in range(i, n, tile):
            if not np.array_equal(K[i:i + tile, j:j + tile], K[j:j + tile, i:i + tile].T):
                return False
    return True


def distinct_count(K: np.ndarray, diag: np.ndarray, policy: SolverPolicy) -> int:
    """How many candidates are left after dropping exact duplicates (or negations) of another: an upper bound on
    rank(K), from one product K v and the pairs whose projections lie close (convalue.solvers.homotopy)."""
    view = SimpleNamespace(K=K, diag=diag, n=K.shape[0])
    return int(representatives(view, max_pairs=policy.homotopy.max_pairs).size)


def check_settings(gamma: float | None, budget: float | None) -> None:
    """Exactly one of gamma >= 0 (penalised form) or budget > 0, both finite."""
    if (gamma is None) == (budget is None):
        raise KMMInputError("give exactly one of gamma (penalised form) or budget (||w||_1 <= budget)")
    if gamma is not None:
        check_number("gamma", gamma, positive=False)
    if budget is not None:
        check_number("budget", budget, positive=True)


#: the loosest stopping tolerance accepted (scikit-learn's Lasso defaults to 1e-4 on its duality gap)
TOL_MAX = 1e-3


def check_tol(tol, gamma: float | None) -> float | None:
    """tol as a float in (0, TOL_MAX], or None; only the penalised form (gamma) stops early."""
    if tol is None:
        return None
    x = check_number("tol", tol, positive=True)
    if x > TOL_MAX:
        raise KMMInputError(f"tol must be at most {TOL_MAX:g} (a KKT violation relative to max(1, max|beta|)), got {x!r}")
    if gamma is None:
        raise KMMInputError("tol applies to the penalised form (gamma) only: the budget form is always solved exactly")
    return x


def check_number(name: str, value, *, positive: bool) -> float:
    """value as a float when it is a finite real number > 0 (positive) or >= 0; otherwise KMMInputError naming it."""
    # strings, bools, complex values and arrays of any size are refused before float() (older numpy converts a
    # one-element array with only a warning); the message shows numpy scalars as plain numbers (-1.0)
    x = None
    if not isinstance(value, (str, bytes, bool, np.bool_, complex, np.complexfloating)) and np.ndim(value) == 0:
        try:
            x = float(value)
        except (TypeError, ValueError):
            pass
    if x is None or not np.isfinite(x) or (x <= 0 if positive else x < 0):
        shown = repr(value) if x is None else repr(x)
        raise KMMInputError(f"{name} must be a finite number {'> 0' if positive else '>= 0'}, got {shown}")
    return x


def check_normalize(normalize: str) -> None:
    """normalize is 'none' or 'cosine'."""
    if normalize not in ("none", "cosine"):
        raise KMMInputError(f"normalize must be 'none' or 'cosine', got {normalize!r}")


def check_norms(diag: np.ndarray, floor: float) -> None:
    """Every candidate's squared gradient norm K_ii must exceed floor (a negative one: K is no Gram matrix)."""
    negative = np.flatnonzero(diag < 0)
    if negative.size:
        i = int(negative[0])
        raise KMMInputError(
            f"K has {negative.size} negative diagonal entr{'y' if negative.size == 1 else 'ies'}, first K[{i}, {i}] = "
            f"{float(diag[i]):.6g}: a Gram matrix G G^T has K_ii = ||g_i||^2 >= 0, so this K is not one"
        )
    zero = np.flatnonzero(diag <= floor)
    if zero.size:
        raise KMMInputError(
            f"{zero.size} candidate(s) have a zero-norm gradient (K_ii = 0), first at index {int(zero[0])}; "
            "drop them or check that their examples have response tokens"
        )


def check_costs(costs: np.ndarray | None, n: int) -> np.ndarray | None:
    """Prices as a float64 vector of length n, finite and > 0 (None stays None)."""
    if costs is None:
        return None
    costs = np.asarray(costs, dtype=np.float64)
    if costs.shape != (n,):
        raise KMMInputError(f"costs must be a vector of length N={n}, got shape {costs.shape}")
    if not np.all(np.isfinite(costs)) or np.any(costs <= 0):
        bad = int(np.flatnonzero(~np.isfinite(costs) | (costs <= 0))[0])
        raise KMMInputError(f"costs must be finite and > 0, got {float(costs[bad])!r} at index {bad}")
    return costs


def symmetrised(K: np.ndarray, sym_tol: float, tile: int) -> tuple[np.ndarray, float]:
    """(0.5 (K + K^T), max |K_ij|) a tile x tile block at a time, after refusing K if max |K - K^T| > sym_tol max |K_ij|.

    Tiles keep the peak at K and its symmetrised copy, where whole-matrix K - K^T and K + K^T held two more N x N
    arrays, and read the transpose in cache. A tile pair that is already exactly symmetric is copied as it is (the
    same result).
    """
    n, b = K.shape[0], tile
    out = np.empty_like(K)
    scale, asym = 1e-300, 0.0
    for i in range(0, n, b):
        for j in range(i, n, b):
            upper, lower_t, tile = K[i:i + b, j:j + b], K[j:j + b, i:i + b].T, out[i:i + b, j:j + b]
            np.subtract(upper, lower_t, out=tile)
            hi, lo = float(tile.max()), float(tile.min())
            scale = max(scale, float(upper.max()), -float(upper.min()))
            if hi == 0.0 and lo == 0.0:
                # an exactly symmetric pair (numpy's G @ G.T is): K's own entries, both copied contiguously
                tile[...] = upper
                if j != i:
                    out[j:j + b, i:i + b] = K[j:j + b, i:i + b]
                continue
            asym = max(asym, hi, -lo)
            scale = max(scale, float(lower_t.max()), -float(lower_t.min()))
            np.add(upper, lower_t, out=tile)
            tile *= 0.5
            if j != i:
                out[j:j + b, i:i + b] = tile.T
    if asym > sym_tol * scale:
        raise KMMInputError(f"K is not symmetric: max |K - K^T| = {asym:.3g} (tolerance {sym_tol * scale:.3g})")
    return out, scale


def low_precision_hint(dtype: np.dtype) -> str:
    """For a K given in float32 or float16: what its round-off does to a rank-deficient Gram, and the remedies."""
    if not np.issubdtype(dtype, np.floating) or np.finfo(dtype).eps <= np.finfo(np.float64).eps:
        return ""
    return (f"; K came as {dtype}, whose round-off (about {np.finfo(dtype).eps:.0e} of max |K_ij| per entry) alone "
            "can push a rank-deficient Gram (N > p) below zero: form it in float64 (G.astype(float64) @ G.T) "
            "or pass a larger psd_tol")


def check_finite(name: str, a: np.ndarray) -> None:
    """Raise KMMInputError naming the first NaN or inf entry of `a` (called `name`).

    A finite sum proves every entry finite in one pass without an N x N temporary (an inf or a NaN makes the sum inf
    or NaN); only a sum that is not finite (or overflows) pays for the entrywise search."""
    with np.errstate(all="ignore"):  # the sum of an inf and a -inf, or an overflow, is the slow path's business
        if a.size and np.isfinite(a.sum()):
            return
    if not np.all(np.isfinite(a)):
        where = tuple(int(i) for i in np.argwhere(~np.isfinite(a))[0])
        raise KMMInputError(f"{name} contains NaN or inf: {name}{list(where)} = {a[where]}")


def make_problem(
    K: np.ndarray,
    beta: np.ndarray,
    *,
    gamma: float | None = None,
    budget: float | None = None,
    costs: np.ndarray | None = None,
    normalize: str = "none",
    sym_tol: float = 1e-6,
    psd_tol: float = 1e-6,
    check_psd: bool = True,
    rank_bound: int | None = None,
    formed: bool = False,
    policy: SolverPolicy = DEFAULT_POLICY,
) -> KMMProblem:
    """Validate K, beta and settings and return a float64 KMMProblem (optionally cosine-normalised).

    rank_bound: an upper bound on rank(K) the caller knows, such as the gradients' dimension p of K = G G^T.
    Validation computes the rank itself within the policy's validation limits (and beyond pivoted_max_n where the
    bound makes the pivoted Cholesky affordable); otherwise a bound below N still lets the solver treat K as
    rank-deficient (supports larger than the rank are singular) instead of finding out slowly.
    formed: the caller formed K as G G^T itself (the trust signal: the engine passes it for the K it builds), so K
    is PSD by construction and obeys Cauchy-Schwarz: validation checks only what construction cannot guarantee
    (non-finite entries, from a non-finite G; exact symmetry, else the symmetrised copy; zero-norm rows) and counts
    exact duplicates (the rank is at most the distinct count, and at most rank_bound), in three passes over K and no
    spectral check: at N = 10,000 that check took 22 s where the solve took 1.1 s. An exactly symmetric K (numpy's
    G @ G.T is) is kept as it is, without a copy. The answer is certified by its KKT conditions either way; a K that
    is no Gram matrix passed as formed is the caller's error (the KKT check holds on it, but the problem is then not
    convex).
    problem.checks says what ran.
    """
    check_settings(gamma, budget)
    if rank_bound is not None and (isinstance(rank_bound, bool) or not isinstance(rank_bound, (int, np.integer))
                                   or rank_bound < 1):
        raise KMMInputError(f"rank_bound must be a positive integer (an upper bound on rank(K)), got {rank_bound!r}")
    check_normalize(normalize)
    check_number("sym_tol", sym_tol, positive=False)
    check_number("psd_tol", psd_tol, positive=False)
    given = np.asarray(K)
    K = given.astype(np.float64, copy=False)
    beta = np.asarray(beta, dtype=np.float64)
    if K.ndim != 2 or K.shape[0] != K.shape[1]:
        raise KMMInputError(f"K must be a square matrix, got shape {K.shape}")
    if beta.ndim != 1 or beta.shape[0] != K.shape[0]:
        raise KMMInputError(f"beta must be a vector of length N={K.shape[0]}, got shape {beta.shape}")
    if K.shape[0] == 0:
        raise KMMInputError("K is empty: there are no candidates to value")
    check_finite("K", K)
    check_finite("beta", beta)
    tile = policy.validation.symmetrise_tile
    if formed and K.flags.c_contiguous and exactly_symmetric(K, tile):
        # K is kept as given (0.5 (K + K^T) is K itself), and a Gram matrix's largest entry is on its diagonal
        # (|K_ij| <= sqrt(K_ii K_jj)): no pass over K for max |K_ij|
        scale = max(float(np.max(np.diag(K))), 1e-300)
    else:
        K, scale = symmetrised(K, sym_tol, tile)
    diag = np.diag(K)
    check_norms(diag, 1e-12 * scale)
    costs = check_costs(costs, beta.shape[0])
    checks: dict = {"formed": bool(formed)}
    if formed:
        with blas_threads(K.shape[0], policy.linalg.single_thread_max_n):  # its one product: 0.2 against 1.2 ms
            distinct = distinct_count(K, diag, policy)
        checks |= {"psd": "formed", "spectral": False, "duplicates": K.shape[0] - distinct}
        lam_min, rank = 0.0, (distinct if distinct < K.shape[0] else None)
        checks["rank"] = "distinct" if rank is not None else None
    elif check_psd:
        lam_min, rank, how = _spectrum_facts(K, psd_tol * scale, rank_bound, policy)
        checks |= {"psd": how, "spectral": True, "rank": "computed" if rank is not None else None}
    else:
        lam_min, rank = 0.0, None
        checks |= {"psd": "skipped", "spectral": False, "rank": None}
    if lam_min < -psd_tol * scale:
        value = f"{lam_min:.3g}" if rank is not None else f"at most {lam_min:.3g} (a LOBPCG estimate)"
        raise KMMInputError(
            f"K is not positive semidefinite: most negative eigenvalue {value} (tolerance {-psd_tol * scale:.3g})"
            + low_precision_hint(given.dtype)
        )
    if rank_bound is not None:
        if rank is None or int(rank_bound) < rank:
            checks["rank"] = "bound"
        rank = min(int(rank_bound), K.shape[0]) if rank is None else min(rank, int(rank_bound))
    if normalize == "cosine":
        d = np.sqrt(diag)
        K = K / np.outer(d, d)
        beta = beta / d
    return KMMProblem(K=K, beta=beta, gamma=None if gamma is None else float(gamma),
                      budget=None if budget is None else float(budget), costs=costs, rank=rank, checks=checks)
