"""K = G G^T reduced tile by tile as row blocks arrive (BLAS, float64), and the metric the Gram is taken in."""

from __future__ import annotations

import numpy as np


class GramReducer:
    """Accumulates Gram tiles K[I, J] = G_I G_J^T as blocks of projected gradients arrive."""

    def __init__(self, *, tiles: bool = True) -> None:
        self.tiles = tiles  # False: only collect the rows (gradient-space solves never form K)
        self._blocks: list[tuple[list[str], np.ndarray]] = []
        self._tiles: dict[tuple[int, int], np.ndarray] = {}

    def add(self, names: list[str], X: np.ndarray) -> None:
        """Add one block of rows; computes its tiles against every block seen so far."""
        X = np.asarray(X, dtype=np.float64 if self.tiles else np.float32)
        j = len(self._blocks)
        self._blocks.append((list(names), X))
        if self.tiles:
            for i, (_, Xi) in enumerate(self._blocks):
                self._tiles[(i, j)] = Xi @ X.T

    def _positions(self, order: list[str]) -> dict[str, int]:
        """Row position of every added name; each must have been added once, and every name of order."""
        added = [n for names, _ in self._blocks for n in names]
        pos = {n: i for i, n in enumerate(added)}
        if len(pos) != len(added):
            dup = sorted({n for n in added if added.count(n) > 1})
            raise ValueError(f"groups added twice: {dup[:10]}")
        missing = [n for n in order if n not in pos]
        if missing:
            raise ValueError(f"no gradient for groups {missing[:10]}")
        return pos

    def gram(self, order: list[str]) -> np.ndarray:
        """K with rows and columns in `order`, assembled from the tiles."""
        if not self.tiles:
            raise ValueError("this reducer collects rows only (tiles=False); it has no Gram matrix")
        pos = self._positions(order)
        offsets = np.cumsum([0] + [len(names) for names, _ in self._blocks])
        K = np.empty((offsets[-1], offsets[-1]))
        for (i, j), tile in self._tiles.items():
            K[offsets[i] : offsets[i + 1], offsets[j] : offsets[j + 1]] = tile
            K[offsets[j] : offsets[j + 1], offsets[i] : offsets[i + 1]] = tile.T
        perm = np.array([pos[n] for n in order])
        return K[np.ix_(perm, perm)]

    def vectors(self, order: list[str]) -> np.ndarray:
        """The added rows in `order` ([len(order), p]; float64, or float32 without tiles)."""
        self._positions(order)
        rows = {n: X[i] for names, X in self._blocks for i, n in enumerate(names)}
        return np.stack([rows[n] for n in order])


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
