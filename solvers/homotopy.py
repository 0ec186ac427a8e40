"""The LARS-lasso homotopy (scikit-learn's lars_path) for rank-deficient K (N > p, duplicated candidates).

From gamma_max down, the homotopy adds or drops one candidate per breakpoint and keeps every support
system nonsingular, so it stays exact where K_AA is singular for any support larger than rank(K): the
regime in which PDAS jumps to singular supports and ADMM crawls. Its cost grows like N rank(K)^2, so it is
the method only for rank-deficient problems of moderate size (the policy's homotopy.max_work).
"""

from __future__ import annotations

import warnings

import numpy as np

from convalue.solvers import plan
from convalue.solvers.policy import SolverPolicy


def distinct(op, max_pairs: int) -> tuple[object, np.ndarray | None]:
    """(the operator on one candidate of every duplicate group, their indices), or (op, None) when there is
    nothing to drop; `expand` puts a solution on the result back on all candidates. max_pairs: see
    _duplicate_pairs."""
    keep = representatives(op, max_pairs=max_pairs)
    if keep.size == op.n:
        return op, None
    return op.restricted(keep), keep


def deduplicated(op, policy: SolverPolicy) -> tuple[object, np.ndarray | None]:
    """distinct(op) for problems headed for the full homotopy, else (op, None): only they pay for the search
    (duplicates make K rank-deficient; the other strategies cope with them through the NNLS polish, and the
    working-set homotopy deduplicates its own small sets). The entry points (convalue.solvers.api, kmm_path) call it
    once and solve on the result."""
    return distinct(op, policy.homotopy.max_pairs) if affordable(op, policy) else (op, None)


def expand(v: np.ndarray, keep: np.ndarray | None, n: int) -> np.ndarray:
    """v (a vector, or rows) over the kept candidates, put back on all n (dropped copies get 0)."""
    if keep is None:
        return v
    full = np.zeros(v.shape[:-1] + (n,))
    full[..., keep] = v
    return full


def affordable(op, policy: SolverPolicy) -> bool:
    """True for a rank-deficient problem small enough for the full homotopy (convalue.solvers.plan.affordable)."""
    return plan.affordable(op.n, int(op.rank_bound), policy)


def _duplicate_pairs(op, tol: float, max_pairs: int) -> tuple[np.ndarray, np.ndarray]:
    """(i, j) with ||g_i -+ g_j||^2 = K_ii + K_jj -+ 2 K_ij <= tol, found through one random projection h_i = <g_i, v>.

    |h_i -+ h_j| <= ||g_i -+ g_j|| ||v||, so such pairs lie within delta = sqrt(tol) ||v|| of each other in |h|,
    and only pairs that close are checked exactly: one product (G v, or K r = G (G^T r) with ||G^T r||^2 = r'Kr)
    instead of a pairwise scan of K. Beyond max_pairs such pairs (many near-equal projections), only sorted
    neighbours are checked.
    """
    rng = np.random.default_rng(0)
    if hasattr(op, "K"):
        r = rng.standard_normal(op.n)
        h = op.K @ r
        norm_v = np.sqrt(max(float(r @ h), 0.0))
    else:
        v = rng.standard_normal(op.G.shape[1])
        h = op.G @ v
        norm_v = float(np.linalg.norm(v))
    h = np.abs(h)
    delta = np.sqrt(tol) * norm_v + 1e-9 * max(float(h.max()), 1e-300)  # plus the products' round-off
    order = np.argsort(h, kind="stable")
    ends = np.searchsorted(h[order], h[order] + delta, side="right")
    counts = ends - np.arange(op.n) - 1  # sorted neighbours within delta after each position
    total = int(counts.sum())
    if total > max_pairs:
        counts = np.minimum(counts, 1)
        total = int(counts.sum())
    a = np.repeat(np.arange(op.n), counts)
    b = a + 1 + np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts)
    i, j = order[a], order[b]
    if i.size == 0:
        return i, j
    k_ij = op.K[i, j] if hasattr(op, "K") else np.einsum("ij,ij->i", op.G[i], op.G[j])
    close = op.diag[i] + op.diag[j] - 2 * np.abs(k_ij) <= tol
    return i[close], j[close]


def representatives(op, rtol: float = 1e-12, *, max_pairs: int) -> np.ndarray:
    """Sorted indices that keep one candidate of every group of duplicated (or negated) gradients.

    Candidates i, j are duplicates when ||g_i -+ g_j||^2 = K_ii + K_jj -+ 2 K_ij <= rtol max K_ii. Dropping
    all but one loses nothing (w_i g_i + w_j g_j = (w_i +- w_j) g_i with no larger l1 norm), and the exact
    ties they cause are what the LARS homotopy cannot resolve (it drops "degenerate regressors" and ends
    at a wrong point).
    """
    # scipy.sparse: only when duplicate candidates are looked for
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    tol = rtol * float(op.diag.max())
    i, j = _duplicate_pairs(op, tol, max_pairs)
    if i.size == 0:
        return np.arange(op.n)
    graph = coo_matrix((np.ones(i.size), (i, j)), shape=(op.n, op.n))
    _, labels = connected_components(graph, directed=False)
    return np.sort(np.unique(labels, return_index=True)[1])


def lars(op, gamma_min: float, *, return_path: bool) -> tuple[np.ndarray, np.ndarray, int]:
    """(gammas, W, steps): the lasso homotopy of 0.5 w'Kw - beta'w + gamma ||w||_1 down to gamma_min.

    With return_path, gammas are the breakpoints (decreasing, the first is max|beta|) and row t of W is the
    exact solution at gammas[t], affine in gamma between rows; otherwise one row, the solution at gamma_min.
    Give it distinct candidates (see representatives): exact ties make scikit-learn's LARS end at a wrong point.
    """
    # scikit-learn (seconds to import): only for the LARS homotopy
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import lars_path, lars_path_gram

    max_iter = 8 * min(op.n, op.rank_bound) + 100
    kw = {"method": "lasso", "max_iter": max_iter, "return_path": return_path, "return_n_iter": True}
    with warnings.catch_warnings():
        # degenerate (tied) regressors and early stops are warned about; the caller certifies by KKT instead
        warnings.simplefilter("ignore", ConvergenceWarning)
        if hasattr(op, "K"):
            # Gram form with n_samples = 1: scikit-learn's alpha is gamma itself
            alphas, _, coefs, steps = lars_path_gram(op.beta, op.K, n_samples=1, alpha_min=gamma_min, **kw)
            scale = 1.0
        else:
            # X = G^T (p samples): scikit-learn minimises ||g - X w||^2 / (2p) + alpha ||w||_1, so alpha = gamma / p
            scale = float(op.G.shape[1])
            alphas, _, coefs, steps = lars_path(op.G.T, op.g, alpha_min=gamma_min / scale, **kw)
    gammas = np.atleast_1d(np.asarray(alphas, dtype=np.float64)) * scale
    W = np.asarray(coefs, dtype=np.float64).T if return_path else np.asarray(coefs, dtype=np.float64)[None, :]
    return gammas, W, int(steps)


def budget_on_path(breakpoints: np.ndarray, W: np.ndarray, budget: float) -> tuple[float, np.ndarray] | None:
    """(gamma, w) where the path's l1 (non-decreasing, affine between breakpoints like w) reaches the budget, or None
    when it stays below it to the path's last row."""
    l1 = np.abs(W).sum(axis=1)
    if l1[-1] < budget:
        return None
    g = float(np.interp(budget, l1, breakpoints))
    return g, path_at(breakpoints, W, g)[0]


def path_at(breakpoints: np.ndarray, W: np.ndarray, gammas: np.ndarray) -> np.ndarray:
    """Row t: the homotopy path (rows W at decreasing breakpoints, affine between them) at gammas[t]; W[0]
    above the first breakpoint, W[-1] below the last."""
    gammas = np.atleast_1d(np.asarray(gammas, dtype=np.float64))
    if breakpoints.size == 1:
        return np.repeat(W, gammas.size, axis=0)
    # segment t - 1 .. t holds gamma: breakpoints[t - 1] >= gamma >= breakpoints[t]
    t = np.clip(np.searchsorted(-breakpoints, -gammas, side="right"), 1, breakpoints.size - 1)
    hi, lo = breakpoints[t - 1], breakpoints[t]
    theta = np.clip((hi - gammas) / np.where(hi > lo, hi - lo, 1.0), 0.0, 1.0)
    return W[t - 1] + theta[:, None] * (W[t] - W[t - 1])
