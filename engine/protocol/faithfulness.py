"""Subset faithfulness (paper Sec. "Dataset Value Scoring Analysis", Tab. subset-faithfulness): do surrogate scores
of k-subsets rank them as their fine-tunes do?

For each subset S of the N candidates (all C(N, k), or a seeded sample) the driver fine-tunes target + S and
measures u_FT(S) = L_val(target only) - L_val(target + S) (datamodel.utilities_from_losses). Each representation
(One-Step, TV) gives K and beta, and two surrogates score S: additive sum_{i in S} beta_i and KMM
sum_{i in S} beta_i - 1/2 sum_{i,j in S} K_ij (= -(1/2 w^T K w - beta^T w) at w = 1_S: the KMM objective of eq.
kmm_qp with lambda = 1, the diagonal included).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

import numpy as np
import pyarrow as pa

#: the paper's experiment: N = 8 auxiliary languages, all C(8, 3) = 56 subsets of size k = 3, top-10 overlap
SUBSET_SIZE = 3
TOP = 10
SURROGATES = ("additive", "kmm")

Subset = tuple[int, ...]


def enumerate_subsets(n: int, k: int = SUBSET_SIZE, *, sample: int | None = None, seed: int = 0) -> list[Subset]:
    """All C(n, k) subsets of size k in lexicographic order, or `sample` of them drawn without replacement by seed
    (in lexicographic order too)."""
    if not 0 < k <= n:
        raise ValueError(f"need 0 < k <= n, got k={k}, n={n}")
    total = math.comb(n, k)
    if sample is None or sample >= total:
        return list(itertools.combinations(range(n), k))
    if sample < 1:
        raise ValueError(f"sample must be >= 1, got {sample}")
    rng = np.random.default_rng([seed, 0xF4])
    if total <= 1_000_000:  # pick indices into the enumeration: exact and uniform
        keep = set(rng.choice(total, size=sample, replace=False).tolist())
        return [s for j, s in enumerate(itertools.combinations(range(n), k)) if j in keep]
    found: set[Subset] = set()
    while len(found) < sample:
        found.add(tuple(sorted(int(i) for i in rng.choice(n, size=k, replace=False))))
    return sorted(found)


def cosine_inputs(K: np.ndarray, beta: np.ndarray, target_norm: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """K and beta of unit vectors: K_ij / sqrt(K_ii K_jj) and beta_i / (sqrt(K_ii) target_norm); with target_norm
    = ||g_tar|| they are cosines (the paper's One-Step and TV), with 1 the solver's normalize="cosine"."""
    K = np.asarray(K, dtype=np.float64)
    d = np.sqrt(np.diag(K))
    if not np.all(d > 0) or not target_norm > 0:
        raise ValueError("every vector, and the target, needs a positive norm to be normalised")
    return K / np.outer(d, d), np.asarray(beta, dtype=np.float64) / (d * target_norm)


def additive_surrogate(subsets: Sequence[Subset], beta: np.ndarray) -> np.ndarray:
    """sum_{i in S} beta_i per subset."""
    beta = np.asarray(beta, dtype=np.float64)
    return np.array([beta[list(s)].sum() for s in subsets])


def kmm_surrogate(subsets: Sequence[Subset], K: np.ndarray, beta: np.ndarray) -> np.ndarray:
    """sum_{i in S} beta_i - 1/2 sum_{i,j in S} K_ij per subset (ordered pairs, i = j included)."""
    K = np.asarray(K, dtype=np.float64)
    return additive_surrogate(subsets, beta) - 0.5 * np.array([K[np.ix_(s, s)].sum() for s in subsets])


def surrogates(subsets: Sequence[Subset], K: np.ndarray, beta: np.ndarray) -> dict[str, np.ndarray]:
    """Both surrogates' scores per subset, by name."""
    return {"additive": additive_surrogate(subsets, beta), "kmm": kmm_surrogate(subsets, K, beta)}


def top_indices(scores: np.ndarray, top: int) -> set[int]:
    """The indices of the `top` highest scores (ties broken by index)."""
    scores = np.asarray(scores, dtype=np.float64)
    return set(np.lexsort((np.arange(scores.size), -scores))[:top].tolist())


@dataclass(frozen=True)
class Agreement:
    """One row of Tab. subset-faithfulness: a surrogate of one representation against u_FT over the subsets."""

    representation: str
    surrogate: str
    spearman_rho: float
    p_value: float
    top_overlap: int
    top: int
    subsets: int

    def to_dict(self) -> dict:
        """JSON-ready fields."""
        return asdict(self)


def agreement(u_ft: np.ndarray, scores: np.ndarray, top: int = TOP) -> tuple[float, float, int]:
    """(Spearman rho, its two-sided p-value, |top-`top` of u_FT & top-`top` of the scores|)."""
    # scipy.stats (1.5 s to import): only when agreement is measured
    from scipy.stats import spearmanr

    u_ft = np.asarray(u_ft, dtype=np.float64)
    scores = np.asarray(scores, dtype=np.float64)
    if u_ft.shape != scores.shape or u_ft.ndim != 1 or u_ft.size < 3:
        raise ValueError(f"need matching vectors of at least 3 subsets, got {u_ft.shape} and {scores.shape}")
    res = spearmanr(u_ft, scores)
    return float(res.statistic), float(res.pvalue), len(top_indices(u_ft, top) & top_indices(scores, top))


def faithfulness(subsets: Sequence[Subset], u_ft: np.ndarray,
                 representations: Mapping[str, tuple[np.ndarray, np.ndarray]], top: int = TOP) -> list[Agreement]:
    """Tab. subset-faithfulness: every representation's (K, beta) x {additive, kmm} against u_FT."""
    out = []
    for rep, (K, beta) in representations.items():
        for name, scores in surrogates(subsets, K, beta).items():
            rho, p, overlap = agreement(u_ft, scores, top)
            out.append(Agreement(rep, name, rho, p, overlap, min(top, len(subsets)), len(subsets)))
    return out


def faithfulness_table(subsets: Sequence[Subset], u_ft: np.ndarray,
                       representations: Mapping[str, tuple[np.ndarray, np.ndarray]],
                       names: Sequence[str] | None = None) -> pa.Table:
    """faithfulness.parquet: per subset its members (names, or indices), u_FT and one column per representation
    and surrogate (`<representation>_<surrogate>`)."""
    u_ft = np.asarray(u_ft, dtype=np.float64)
    if u_ft.shape != (len(subsets),):
        raise ValueError(f"need one u_FT per subset ({len(subsets)}), got shape {u_ft.shape}")
    members = [[names[i] for i in s] for s in subsets] if names is not None else [list(s) for s in subsets]
    columns: dict[str, pa.Array] = {
        "subset": pa.array(members, type=pa.list_(pa.string() if names is not None else pa.int64())),
        "u_ft": pa.array(u_ft)}
    for rep, (K, beta) in representations.items():
        for name, scores in surrogates(subsets, K, beta).items():
            columns[f"{rep}_{name}"] = pa.array(scores)
    return pa.table(columns)

