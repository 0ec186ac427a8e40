"""A stored pool loaded for valuation (`convalue score`): its blocks read into Ray's object store, spread over the
nodes that read the run's store as the driver does (every node for a filesystem URI; for a local path, the nodes
that mount it: a shared disk), or left in the store until a product needs them where a prior valuation reuses
their rows."""

from __future__ import annotations

import hashlib
import logging

import numpy as np
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from convalue.actors.gram import load_block
from convalue.actors.sharded import StoredBlock, manifest_digest
from convalue.engine.data.prepare import TARGET_KEY
from convalue.engine.driver.featurize import FeaturizeResult, FeaturizeStats
from convalue.engine.driver.prior import PriorRun, stored_rows
from convalue.engine.files.errors import StoreError
from convalue.engine.selection.incremental import reuse_of
from convalue.engine.store.vectors import MANIFEST, BlockMeta, VectorStore

log = logging.getLogger("convalue")


def readers(store: VectorStore) -> list[str]:
    """The alive nodes that read the store's manifest as the driver does, the driver's node first."""
    here = ray.get_runtime_context().get_node_id()
    others = [n["NodeID"] for n in ray.nodes() if n.get("Alive") and n["NodeID"] != here]
    if store.folder.local is None or not others:
        return [here, *others]
    digest = hashlib.sha256(store.folder.read_bytes(MANIFEST)).hexdigest()
    probes = [(node, manifest_digest.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False))
               .remote(store.folder)) for node in others]
    return [here] + [node for node, ref in probes if ray.get(ref) == digest]


def _load(store: VectorStore, metas: list[BlockMeta], nodes_: list[str], refs: dict, nodes: dict) -> None:
    """Read blocks into the object store, each on the next of `nodes_` in turn; a block failing its checksum is set
    aside and refused."""
    pending = []
    for k, meta in enumerate(metas):
        node = nodes_[k % len(nodes_)]
        opts = {"scheduling_strategy": NodeAffinitySchedulingStrategy(node, soft=False)}
        pending.append((meta, node, *load_block.options(**opts).remote(store.folder, meta)))
    for meta, node, error, array in pending:
        if (why := ray.get(error)) is not None:
            store.set_aside(meta, "checksum mismatch when read back")
            raise StoreError(f"{store.folder}: block {meta.file} failed its checksum (set aside): {why}; import the "
                             "vectors again with --overwrite")
        refs[meta.file], nodes[meta.file] = array, (node, meta.size)


def load_pool(store: VectorStore, names: list[str], prior: PriorRun | None, metric: str,
              normalize: str) -> tuple[FeaturizeResult, dict]:
    """A stored pool ready to value: (its blocks and target, the array source of each block). Every block is read
    into the object store, spread over the nodes that read the store, except where a prior valuation reuses rows in
    gradient space (`prior` given): blocks holding reused rows only stay in the store (actors.sharded.StoredBlock)
    until a product needs them."""
    where = stored_rows(store, names)
    refs: dict = {}
    nodes: dict = {}
    spread = readers(store)
    target_meta, target_row = where[TARGET_KEY]
    _load(store, [target_meta], spread[:1], refs, nodes)  # whether the prior applies depends on the target
    lazy: set[str] = set()
    if prior is not None:
        target = np.asarray(ray.get(refs[target_meta.file])[target_row], np.float64)
        reuse, _ = reuse_of(prior.state, names, [where[n][0].file for n in names], target, metric, normalize)
        if reuse is not None:
            fresh = {where[names[i]][0].file for i in reuse.new_rows} | {target_meta.file}
            lazy = {where[n][0].file for n in names} - fresh
    wanted = {where[n][0].file: where[n][0] for n in names}
    _load(store, [m for f, m in wanted.items() if f not in lazy and f not in refs], spread, refs, nodes)
    for f in lazy:
        nodes[f] = (None, wanted[f].size)
    found = {n: (where[n][0].file, where[n][1]) for n in [TARGET_KEY, *names]}
    features = FeaturizeResult.of(names, found, refs, nodes, FeaturizeStats(0, len(names) + 1))
    local = store.folder.local is not None
    sources = dict(refs) | {f: StoredBlock(store.folder, wanted[f], local) for f in lazy}
    log.info("%d blocks read on %d node(s)%s", len(refs), len(spread),
             f"; {len(lazy)} left in the store until a product needs them" if lazy else "")
    return features, sources
