"""Selection from signed scores: ranks and the top-k positive groups (paper Alg. 1, lines 1-9)."""

from __future__ import annotations

import numpy as np


def rank_order(w: np.ndarray, beta: np.ndarray) -> np.ndarray:
    """Indices sorted by score descending; ties (e.g. zeros) broken by alignment beta, then index."""
    w = np.asarray(w, dtype=np.float64)
    return np.lexsort((np.arange(w.size), -np.asarray(beta, dtype=np.float64), -w))


def ranks(w: np.ndarray, beta: np.ndarray) -> np.ndarray:
    """1-based rank of every candidate (1 = highest score)."""
    r = np.empty(len(w), dtype=np.int64)
    r[rank_order(w, beta)] = np.arange(1, len(w) + 1)
    return r


def select_top_k(w: np.ndarray, beta: np.ndarray, k: int, *, tol: float = 1e-9) -> list[int]:
    """Indices of the (at most) k highest-scoring candidates whose score is positive: above tol times the largest
    |score|, so a solver's round-off is not bought and the choice does not depend on the scores' units."""
    if k <= 0:
        raise ValueError(f"k must be > 0, got {k}")
    w = np.asarray(w, dtype=np.float64)
    floor = tol * float(np.abs(w).max()) if w.size else 0.0
    return [int(i) for i in rank_order(w, beta) if w[i] > floor][:k]
