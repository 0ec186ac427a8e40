"""K = G G^T and beta = G g_tar, reduced tile by tile as row blocks arrive (BLAS, float64 accumulation)."""

from __future__ import annotations

import numpy as np


class GramReducer:
    """Accumulates Gram tiles K[I, J] = G_I G_J^T as blocks of projected gradients arrive."""

    def __init__(self) -> None:
        self._blocks: list[tuple[list[str], np.ndarray]] = []
        self._tiles: dict[tuple[int, int], np.ndarray] = {}

    def add(self, names: list[str], X: np.ndarray) -> None:
        """Add one block of rows; computes its tiles against every block seen so far."""
        X = np.asarray(X, dtype=np.float64)
        j = len(self._blocks)
        self._blocks.append((list(names), X))
        for i, (_, Xi) in enumerate(self._blocks):
            self._tiles[(i, j)] = Xi @ X.T

    def result(self, order: list[str], g_tar: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(K, beta) with rows in `order`; every name must have been added exactly once."""
        added = [n for names, _ in self._blocks for n in names]
        pos = {n: i for i, n in enumerate(added)}
        if len(pos) != len(added):
            dup = sorted({n for n in added if added.count(n) > 1})
            raise ValueError(f"groups added twice: {dup[:10]}")
        missing = [n for n in order if n not in pos]
        if missing:
            raise ValueError(f"no gradient for groups {missing[:10]}")
        offsets = np.cumsum([0] + [len(names) for names, _ in self._blocks])
        K = np.empty((len(added), len(added)))
        for (i, j), tile in self._tiles.items():
            K[offsets[i] : offsets[i + 1], offsets[j] : offsets[j + 1]] = tile
            K[offsets[j] : offsets[j + 1], offsets[i] : offsets[i + 1]] = tile.T
        G = np.concatenate([X for _, X in self._blocks])
        perm = np.array([pos[n] for n in order])
        beta = G[perm] @ np.asarray(g_tar, dtype=np.float64)
        return K[np.ix_(perm, perm)], beta


def gram_and_beta(G: np.ndarray, g_tar: np.ndarray, block_rows: int = 1024) -> tuple[np.ndarray, np.ndarray]:
    """(K, beta) of an in-memory G [N, p] in row blocks."""
    G = np.asarray(G)
    N = G.shape[0]
    K = np.empty((N, N))
    for s in range(0, N, block_rows):
        Gi = G[s : s + block_rows].astype(np.float64)
        for t in range(s, N, block_rows):
            tile = Gi @ G[t : t + block_rows].astype(np.float64).T
            K[s : s + block_rows, t : t + block_rows] = tile
            K[t : t + block_rows, s : s + block_rows] = tile.T
    beta = G.astype(np.float64) @ np.asarray(g_tar, dtype=np.float64)
    return K, beta


def cosine(beta: np.ndarray, K: np.ndarray, g_tar: np.ndarray) -> np.ndarray:
    """One-step cosine between each g_i and g_tar: beta_i / (||g_i|| ||g_tar||)."""
    norms = np.sqrt(np.clip(np.diag(K), 0, None)) * float(np.linalg.norm(np.asarray(g_tar, dtype=np.float64)))
    return np.divide(beta, norms, out=np.zeros_like(beta), where=norms > 0)
