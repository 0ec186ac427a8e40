"""The blocked Gram (Ray-free): which rows of which stored block hold each group, panels of blocks, and the
per-tile arithmetic K_ij = X_i X_j^T, beta_i = X_i g_tar in the run's metric."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

#: a panel gathers blocks up to about this many rows: one tile task multiplies two panels
PANEL_ROWS = 2048


@dataclass(frozen=True)
class BlockRows:
    """One stored block and the rows of it a panel uses: `rows` index the block, `positions` the run's order."""

    file: str
    rows: tuple[int, ...]
    positions: tuple[int, ...]
    node: str | None = None  # where the block's array lives while the run is live (None: in a store only)
    nbytes: int = 0


@dataclass(frozen=True)
class Panel:
    """Consecutive blocks of at most about PANEL_ROWS rows; its positions are the rows of K it covers."""

    blocks: tuple[BlockRows, ...]

    @property
    def positions(self) -> np.ndarray:
        """The panel's rows in the run's order."""
        return np.array([p for b in self.blocks for p in b.positions], dtype=np.int64)

    @property
    def nbytes(self) -> int:
        """Bytes of the panel's block arrays."""
        return sum(b.nbytes for b in self.blocks)


def panels_of(blocks: list[BlockRows], panel_rows: int = PANEL_ROWS) -> list[Panel]:
    """Blocks grouped into panels of about panel_rows rows, blocks of one node together (fewer bytes moved)."""
    ordered = sorted(blocks, key=lambda b: (b.node or "", b.file))
    panels, current, rows = [], [], 0
    for b in ordered:
        if current and (rows + len(b.rows) > panel_rows or b.node != current[-1].node):
            panels.append(Panel(tuple(current)))
            current, rows = [], 0
        current.append(b)
        rows += len(b.rows)
    if current:
        panels.append(Panel(tuple(current)))
    return panels


#: rows of a block cast to float64 at a time in a product (a 512 x 8192 float64 chunk: 32 MiB)
CAST_ROWS = 512


def rows_of_blocks(names: list[str], found: dict[str, tuple[str, int]],
                   place: dict[str, tuple[str | None, int]]) -> list[BlockRows]:
    """The BlockRows of `names` in order, from each name's (block file, row) in `found`; each block's (node, bytes)
    from `place`."""
    by_file: dict[str, list[tuple[int, int]]] = {}
    for pos, name in enumerate(names):
        file, row = found[name]
        by_file.setdefault(file, []).append((row, pos))
    return [BlockRows(f, tuple(r for r, _ in rows), tuple(q for _, q in rows), *place[f])
            for f, rows in by_file.items()]


def rows_times(a: np.ndarray, rows: np.ndarray, u: np.ndarray) -> np.ndarray:
    """a[rows] @ u in float64, CAST_ROWS float32 rows cast at a time (no float64 copy of the block)."""
    return np.concatenate([a[rows[lo:lo + CAST_ROWS]].astype(np.float64) @ u
                           for lo in range(0, rows.size, CAST_ROWS)] or [np.zeros(0)])


def gather_float64(n: int, panels: list[Panel], arrays: list[np.ndarray]) -> np.ndarray:
    """G (n rows, float64) in the run's order from the panels' block arrays (in panel order), cast block by block:
    no float32 copy of G is made beside it."""
    G, k = None, 0
    for panel in panels:
        for a, b in zip(arrays[k:k + len(panel.blocks)], panel.blocks):
            if G is None:
                G = np.empty((n, a.shape[1]), np.float64)
            G[list(b.positions)] = a[list(b.rows)]
        k += len(panel.blocks)
    if G is None:
        raise ValueError("no block arrays to gather")
    return G


def stack_rows(arrays: list[np.ndarray], blocks: tuple[BlockRows, ...]) -> np.ndarray:
    """The panel's matrix: each block's used rows, in panel order, as float64."""
    return np.concatenate([np.asarray(a, np.float64)[list(b.rows)] for a, b in zip(arrays, blocks)])


@dataclass
class TileResult:
    """One tile of K (panel i x panel j) in the metric; on a diagonal tile also beta and the raw row statistics."""

    i: int
    j: int
    K: np.ndarray | None  # None: a diagonal tile's statistics only (gradient space)
    beta: np.ndarray | None = None
    raw_dot: np.ndarray | None = None  # X_i g_tar (Euclidean), for the one-step cosine
    raw_norm2: np.ndarray | None = None
    diag: np.ndarray | None = None  # K_ii in the metric
    node: str = ""
    bytes_moved: int = 0


def tile(i: int, j: int, Xi: np.ndarray, Xj: np.ndarray | None, g: np.ndarray, root: np.ndarray | None,
         with_K: bool = True) -> TileResult:
    """K_ij = (X_i M^1/2)(X_j M^1/2)^T (M = I unless root is the diagonal Fisher's M^1/2); with Xj None the
    diagonal tile, with beta_i = X_i M^1/2 g~ and the raw statistics (without its K where with_K is False)."""
    Mi = Xi if root is None else Xi * root
    if Xj is not None:
        Mj = Xj if root is None else Xj * root
        return TileResult(i, j, Mi @ Mj.T)
    gm = g if root is None else np.divide(g, root, out=np.zeros_like(g), where=root > 0)
    return TileResult(i, i, Mi @ Mi.T if with_K else None, beta=Mi @ gm, raw_dot=Xi @ g,
                      raw_norm2=np.einsum("ij,ij->i", Xi, Xi), diag=np.einsum("ij,ij->i", Mi, Mi))


@dataclass
class GramResult:
    """K (None in gradient space), beta in the metric, the one-step cosine, M, and where the tiles ran."""

    K: np.ndarray | None
    beta: np.ndarray
    cosine: np.ndarray
    row_norm2: np.ndarray
    M: np.ndarray | None
    diag: np.ndarray | None = None  # K_ii in the metric (the gradient-space solve's normalisation and gamma_max)
    stats: dict = field(default_factory=dict)


def assemble(n: int, panels: list[Panel], tiles: list[TileResult], g: np.ndarray, with_K: bool = True,
             M: np.ndarray | None = None) -> GramResult:
    """K, beta and the cosine of n rows from the tiles of `panels` (each pair i <= j once)."""
    K = np.empty((n, n)) if with_K else None
    # zeros, not np.empty: an incremental Gram computes only the new rows' tiles, and the reused rows' statistics
    # come from the prior afterwards (uninitialised memory here made NaN/overflow warnings in the cosine)
    beta, dot, norm2, diag = np.zeros(n), np.zeros(n), np.zeros(n), np.zeros(n)
    for t in tiles:
        pi, pj = panels[t.i].positions, panels[t.j].positions
        if K is not None:
            K[np.ix_(pi, pj)] = t.K
            K[np.ix_(pj, pi)] = t.K.T
        if t.beta is not None:
            beta[pi], dot[pi], norm2[pi], diag[pi] = t.beta, t.raw_dot, t.raw_norm2, t.diag
    norms = np.sqrt(norm2) * float(np.linalg.norm(g))
    cos = np.divide(dot, norms, out=np.zeros(n), where=norms > 0)
    nodes: dict[str, int] = {}
    for t in tiles:
        nodes[t.node] = nodes.get(t.node, 0) + 1
    stats = {"panels": len(panels), "tiles": len(tiles), "tiles_per_node": nodes,
             "bytes_moved": int(sum(t.bytes_moved for t in tiles)),
             "bytes_read": int(sum(panels[t.i].nbytes + (panels[t.j].nbytes if t.j != t.i else 0) for t in tiles))}
    if len(tiles) <= 64:  # where each tile ran, against where its blocks lived
        stats["tile_detail"] = [{"i": t.i, "j": t.j, "node": t.node, "bytes_moved": int(t.bytes_moved),
                                 "block_nodes": sorted({b.node or "" for b in panels[t.i].blocks + panels[t.j].blocks})}
                                for t in tiles]
    return GramResult(K=K, beta=beta, cosine=cos, row_norm2=norm2, M=M, stats=stats, diag=diag)


def fisher_root(col_sq_sums: list[np.ndarray], n: int) -> tuple[np.ndarray, np.ndarray]:
    """(M, M^1/2) of the diagonal empirical Fisher from per-panel column sums of squares (mean over n rows,
    scaled to mean 1, as engine.selection.gram.diag_fisher_vectors)."""
    M = np.sum(col_sq_sums, axis=0) / n
    if not M.any():
        raise ValueError("every candidate vector is zero: the diagonal Fisher metric is undefined")
    M = M / M.mean()
    return M, np.sqrt(M)
