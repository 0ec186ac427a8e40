"""The distributed blocked Gram: block arrays kept in Ray's object store (or read from the run's store by a task),
tile tasks K_ij = X_i X_j^T scheduled where their blocks live, the tiles assembled by the driver."""

from __future__ import annotations

import numpy as np
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from convalue.engine.files.errors import StoreError
from convalue.engine.files.folder import RunFolder
from convalue.engine.selection.blocked import (
    BlockRows,
    GramResult,
    Panel,
    TileResult,
    assemble,
    fisher_root,
    gather_float64,
    panels_of,
    stack_rows,
    tile,
)
from convalue.engine.store.vectors import BlockMeta, block_vectors


def _node() -> str:
    return ray.get_runtime_context().get_node_id()


# one CPU: with none, Ray starts a worker process for every block at once (40 blocks of 4 MB: 85 s against 4.4 s)
@ray.remote(num_cpus=1, num_returns=2)
def load_block(folder: RunFolder, meta: BlockMeta) -> tuple[str | None, np.ndarray | None]:
    """(None, a stored block's vectors) read into the object store of the node that reads it, or (why, None) when
    its checksum fails (the driver then sets it aside and computes its groups again)."""
    try:
        return None, block_vectors(folder, meta)
    except (StoreError, OSError) as exc:
        return str(exc), None


@ray.remote(num_cpus=1)
def gram_tile(i: int, j: int, g: np.ndarray, root: np.ndarray | None, panel_i: Panel, panel_j: Panel | None,
              *arrays: np.ndarray, with_K: bool = True) -> TileResult:
    """One tile of the Gram (the diagonal one, with beta and row statistics, when panel_j is None; without its K
    where with_K is False)."""
    n_i = len(panel_i.blocks)
    Xi = stack_rows(list(arrays[:n_i]), panel_i.blocks)
    Xj = None if panel_j is None else stack_rows(list(arrays[n_i:]), panel_j.blocks)
    result = tile(i, j, Xi, Xj, g, root, with_K)
    result.node = _node()
    blocks = panel_i.blocks + (panel_j.blocks if panel_j is not None else ())
    result.bytes_moved = sum(b.nbytes for b in blocks if b.node is not None and b.node != result.node)
    return result


@ray.remote(num_cpus=1)
def column_squares(panel: Panel, *arrays: np.ndarray) -> np.ndarray:
    """The column sums of squares of a panel's rows (for the diagonal Fisher metric)."""
    X = stack_rows(list(arrays), panel.blocks)
    return np.einsum("ij,ij->j", X, X)


@ray.remote(num_cpus=1)
def gather_rows(n: int, panels: list[Panel], *arrays: np.ndarray) -> np.ndarray:
    """G in the run's order (n rows, float64) from the panels' blocks, on a worker, never in the driver."""
    return gather_float64(n, panels, list(arrays))


def node_addresses(ids) -> dict[str, dict]:
    """Each node id's IP address and host name from Ray's node table, and whether it is the driver's node (for
    summary.json: a report names nodes by these, not by their ids)."""
    here = ray.get_runtime_context().get_node_id()
    table = {n.get("NodeID"): n for n in ray.nodes()}
    return {i: {"ip": table.get(i, {}).get("NodeManagerAddress"), "host": table.get(i, {}).get("NodeManagerHostname"),
                "driver": i == here} for i in ids}


def panel_refs(panel: Panel, refs: dict[str, ray.ObjectRef]) -> list[ray.ObjectRef]:
    """The object refs of the panel's blocks, in its order."""
    return [refs[b.file] for b in panel.blocks]


def near(*panels: Panel) -> dict:
    """Task options that place it on the node holding most of the panels' block bytes (soft: elsewhere when that
    node is gone); none where the blocks live in a store only."""
    weight: dict[str, int] = {}
    for panel in panels:
        for b in panel.blocks:
            if b.node is not None:
                weight[b.node] = weight.get(b.node, 0) + b.nbytes
    if not weight:
        return {}
    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(max(weight, key=weight.get), soft=True)}


def build_gram(blocks: list[BlockRows], refs: dict[str, ray.ObjectRef], n: int, g: np.ndarray, metric: str,
               with_K: bool = True) -> GramResult:
    """K (when with_K) and beta of n rows in the metric, and the cosine, from tile tasks over panels of `blocks`
    (whose arrays are `refs`, by file); a panel pair i <= j once, each tile on the node holding most of its
    blocks' bytes."""
    panels = panels_of(blocks)
    root = M = None
    if metric == "diag_fisher":
        sums = ray.get([column_squares.options(**near(p)).remote(p, *panel_refs(p, refs)) for p in panels])
        M, root = fisher_root(sums, n)
    g_ref, root_ref = ray.put(np.asarray(g, np.float64)), ray.put(root)
    calls = []
    for i, pi in enumerate(panels):
        calls.append(gram_tile.options(**near(pi)).remote(i, i, g_ref, root_ref, pi, None, *panel_refs(pi, refs),
                                                           with_K=with_K))
        if with_K:
            calls += [gram_tile.options(**near(pi, pj)).remote(i, j, g_ref, root_ref, pi, pj, *panel_refs(pi, refs),
                                                                *panel_refs(pj, refs))
                      for j, pj in enumerate(panels[i + 1:], start=i + 1)]
    result = assemble(n, panels, ray.get(calls), np.asarray(g, np.float64), with_K=with_K, M=M)
    result.stats["nodes"] = node_addresses(result.stats["tiles_per_node"])
    return result
