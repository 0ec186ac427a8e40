"""Pairwise transfer (paper Fig. pairwise_relation and Tab. zh_results): each of M groups in turn as the target,
valued by KMM against all the others, from one featurisation G (M x p).

Row t of the scores matrix is the target, column j the source: W[t, j] = w_j of the KMM solve (eq.
kmm_l1_penalized) on K = G_others G_others^T and beta = G_others g_t; the diagonal is NaN (a group is no
candidate for itself). The positive/negative sets of Tab. zh_results are read off one row.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

#: gamma as a fraction of max|beta| (beta after normalisation): the paper's larger KMM gamma, 5e-2
GAMMA_RATIO = 5e-2
#: Tab. zh_results: four positive (en, sv, ru, es) and four negative (te, ml, kn, ta) auxiliaries
SET_SIZE = 4


def transfer_scores(G: np.ndarray, *, gamma_ratio: float = GAMMA_RATIO, normalize: str = "cosine") -> np.ndarray:
    """W (M x M): row t the KMM scores of every other group with group t as the target (diagonal NaN); gamma =
    gamma_ratio * max|beta| of each row's (normalised) problem."""
    # convalue.solvers loads SciPy: only when transfer scores are computed
    from convalue.solvers import solve_kmm
    from convalue.solvers.linalg import self_gram

    G = np.asarray(G, dtype=np.float64)
    if G.ndim != 2 or G.shape[0] < 2:
        raise ValueError(f"G must be M x p with M >= 2 groups, got shape {G.shape}")
    if not 0.0 <= gamma_ratio < 1.0:
        raise ValueError(f"gamma_ratio must be in [0, 1), got {gamma_ratio}")
    if normalize not in ("none", "cosine"):
        raise ValueError(f"normalize must be 'none' or 'cosine', got {normalize!r}")
    M = G.shape[0]
    full = self_gram(G)
    W = np.full((M, M), np.nan)
    for t in range(M):
        others = np.array([j for j in range(M) if j != t])
        K = full[np.ix_(others, others)]
        beta = full[others, t]
        seen = beta / np.sqrt(np.diag(K)) if normalize == "cosine" else beta  # the beta the solver sees
        scale = float(np.abs(seen).max())
        if scale == 0.0:  # the target is orthogonal to every other group: nothing transfers
            W[t, others] = 0.0
            continue
        sol = solve_kmm(K, beta, gamma=gamma_ratio * scale, normalize=normalize, rank_bound=int(G.shape[1]))
        W[t, others] = sol.w
    return W


def signed_ranks(W: np.ndarray, *, tol: float = 1e-9) -> np.ndarray:
    """Fig. pairwise_relation's discrete signed ranks per row, anchored at zero: the P positive scores ranked
    1..P and the Q negative ones -1..-Q, the magnitude growing with |w|; 0 for |w| <= tol max|row|; NaN stays."""
    W = np.asarray(W, dtype=np.float64)
    R = np.where(np.isnan(W), np.nan, 0.0)
    for t, row in enumerate(W):
        finite = np.isfinite(row)
        floor = tol * float(np.abs(row[finite]).max()) if finite.any() else 0.0
        for sign in (1.0, -1.0):
            idx = np.flatnonzero(finite & (sign * np.nan_to_num(row) > floor))
            order = idx[np.argsort(sign * row[idx], kind="stable")]  # weakest first
            R[t, order] = sign * np.arange(1, order.size + 1)
    return R


@dataclass(frozen=True)
class PositiveNegative:
    """Tab. zh_results for one target: its most positively and most negatively scored auxiliaries, and the three
    fine-tunes to compare (target only, target + positive, target + positive + negative)."""

    target: str
    positive: tuple[str, ...]
    negative: tuple[str, ...]

    def runs(self) -> dict[str, tuple[str, ...]]:
        """The auxiliary groups of each fine-tune, by label."""
        return {"target_only": (), "pos": self.positive, "pos_neg": self.positive + self.negative}


def positive_negative(W: np.ndarray, names: Sequence[str], target: str, *, n_pos: int = SET_SIZE,
                      n_neg: int = SET_SIZE, tol: float = 1e-9) -> PositiveNegative:
    """The target's row of W: up to n_pos groups with the highest strictly positive scores (best first) and up to
    n_neg with the lowest strictly negative ones (worst first); |w| <= tol max|row| counts as zero."""
    names = list(names)
    t = names.index(target)
    row = np.asarray(W, dtype=np.float64)[t]
    finite = [j for j in range(len(names)) if j != t and np.isfinite(row[j])]
    floor = tol * max((abs(row[j]) for j in finite), default=0.0)
    pos = sorted((j for j in finite if row[j] > floor), key=lambda j: (-row[j], j))[:n_pos]
    neg = sorted((j for j in finite if row[j] < -floor), key=lambda j: (row[j], j))[:n_neg]
    return PositiveNegative(target, tuple(names[j] for j in pos), tuple(names[j] for j in neg))


def cluster_order(W: np.ndarray, *, method: str = "average") -> list[int]:
    """A heatmap order of the groups (the same for rows and columns): the leaves of a hierarchical clustering of
    each group's profile, its row (as target) and column (as source) of W, NaN as 0, optimally ordered."""
    # SciPy's hierarchy clustering: only when a heatmap is ordered
    from scipy.cluster.hierarchy import leaves_list, linkage

    W = np.nan_to_num(np.asarray(W, dtype=np.float64))
    if W.shape[0] < 2:
        return list(range(W.shape[0]))
    profile = np.hstack([W, W.T])
    return [int(i) for i in leaves_list(linkage(profile, method=method, metric="euclidean", optimal_ordering=True))]
