"""The metric the Gram is taken in (Euclidean or the diagonal empirical Fisher), and the one-step cosine."""

from __future__ import annotations

import numpy as np


def diag_fisher_vectors(G: np.ndarray, g_tar: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(G~, g~_tar, M) in the diagonal empirical-Fisher metric of paper App. F.1.

    M = diag(F), F = (1/N) sum_i g_i g_i^T over the N candidates; g~_i = M^(1/2) g_i and
    g~_tar = M^(+/2) g_tar, so K = G~ G~^T = G M G^T and beta = G~ g~_tar = G P_M g_tar with P_M the
    projector onto M's support. M is scaled to mean 1, a global rescaling (the isotropic case is then
    M = I), so one gamma means the same in both metrics.
    """
    G = np.asarray(G, dtype=np.float64)
    M = np.mean(G**2, axis=0)
    if not M.any():
        raise ValueError("every candidate vector is zero: the diagonal Fisher metric is undefined")
    M = M / M.mean()
    root = np.sqrt(M)
    g = np.asarray(g_tar, dtype=np.float64)
    return G * root, np.divide(g, root, out=np.zeros_like(g), where=M > 0), M


def metric_vectors(metric: str, G: np.ndarray, g_tar: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(G, g_tar) in the run's metric (features.metric), and M for `diag_fisher` (None for `euclidean`)."""
    if metric == "diag_fisher":
        return diag_fisher_vectors(G, g_tar)
    return G, g_tar, None


def cosine(G: np.ndarray, g_tar: np.ndarray) -> np.ndarray:
    """One-step cosine between each row g_i of G and g_tar (Euclidean, whatever metric the Gram uses)."""
    G = np.asarray(G, dtype=np.float64)
    g = np.asarray(g_tar, dtype=np.float64)
    norms = np.linalg.norm(G, axis=1) * float(np.linalg.norm(g))
    return np.divide(G @ g, norms, out=np.zeros(len(G)), where=norms > 0)
