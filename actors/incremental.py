"""Incremental valuation on Ray: of a grown pool, only the new rows' Gram tiles (K[new, all]) are computed, beside
the prior's K; in gradient space only the new rows' statistics and their residual at the prior's u. Every task runs
near its blocks, as the blocked Gram's do (actors/gram.py)."""

from __future__ import annotations

import numpy as np
import ray

from convalue.actors.gram import gram_tile, near, node_addresses, panel_refs
from convalue.actors.sharded import panel_times
from convalue.engine.selection.blocked import BlockRows, GramResult, Panel, assemble, panels_of
from convalue.engine.selection.incremental import Reuse, carry_prior, place_old_gram, split_blocks


def extend_gram(old_K: np.ndarray, reuse: Reuse, blocks: list[BlockRows], refs: dict[str, ray.ObjectRef], n: int,
                g: np.ndarray) -> GramResult:
    """K of the grown pool (Euclidean): the prior's K (old_K, a memory map of its gram.npy) on reused rows, and only
    the tiles of the new rows' panels against every panel; beta and the row statistics likewise."""
    old_parts, new_parts = split_blocks(blocks, reuse.old < 0)
    old_panels, new_panels = panels_of(old_parts), panels_of(new_parts)
    panels = old_panels + new_panels
    g_ref = ray.put(np.asarray(g, np.float64))
    calls = []
    for j in range(len(old_panels), len(panels)):
        pj = panels[j]
        calls.append(gram_tile.options(**near(pj)).remote(j, j, g_ref, None, pj, None, *panel_refs(pj, refs)))
        calls += [gram_tile.options(**near(pi, pj)).remote(i, j, g_ref, None, pi, pj, *panel_refs(pi, refs),
                                                            *panel_refs(pj, refs))
                  for i, pi in enumerate(panels[:j])]
    result = assemble(n, panels, ray.get(calls), np.asarray(g, np.float64), with_K=True)
    place_old_gram(result.K, old_K, reuse)
    result.stats["nodes"] = node_addresses(result.stats["tiles_per_node"])
    return carry_prior(result, reuse)


def new_row_stats(reuse: Reuse, blocks: list[BlockRows], refs: dict[str, ray.ObjectRef], n: int,
                  g: np.ndarray) -> GramResult:
    """beta and the row statistics of the grown pool in gradient space (Euclidean): the new rows' from diagonal
    tiles without K, the reused rows' from the prior."""
    _, new_parts = split_blocks(blocks, reuse.old < 0)
    panels = panels_of(new_parts)
    g_ref = ray.put(np.asarray(g, np.float64))
    calls = [gram_tile.options(**near(p)).remote(i, i, g_ref, None, p, None, *panel_refs(p, refs), with_K=False)
             for i, p in enumerate(panels)]
    result = assemble(n, panels, ray.get(calls), np.asarray(g, np.float64), with_K=False)
    result.stats["nodes"] = node_addresses(result.stats["tiles_per_node"])
    return carry_prior(result, reuse)


def times_rows(parts: list[BlockRows], refs: dict[str, ray.ObjectRef], u: np.ndarray, n: int) -> np.ndarray:
    """(G u) on the rows of `parts` (a length-n vector, NaN elsewhere): one task per panel, near its blocks."""
    panels: list[Panel] = panels_of(parts)
    u_ref = ray.put(np.asarray(u, np.float64))
    calls = [(p, panel_times.options(**near(p)).remote(p, u_ref, *panel_refs(p, refs))) for p in panels]
    out = np.full(n, np.nan)
    for p, call in calls:
        out[p.positions] = ray.get(call)[0]
    return out
