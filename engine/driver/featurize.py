"""The featurisation stage: every group's projected gradient, computed on GradientWorker actors (or read back
from the run's vector store), written block by block to the store."""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass

import numpy as np
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from convalue.actors.gradient_worker import GradientWorker, StoreTarget
from convalue.actors.gram import load_block
from convalue.actors.pool import ActorPool
from convalue.actors.progress import Progress
from convalue.engine.config import RunConfig
from convalue.engine.data.prepare import TARGET_KEY, PreparedData, preview_key
from convalue.engine.data.tokenize import WorkItem
from convalue.engine.features.batching import block_tokens, plan_blocks
from convalue.engine.model.spec import ReplicaSpec
from convalue.engine.selection.blocked import BlockRows, rows_of_blocks
from convalue.engine.store.vectors import VectorStore, write_block

log = logging.getLogger("convalue")


@dataclass
class FeaturizeStats:
    """What the stage computed and reused, and how fast (summary.json's `featurize`)."""

    groups_computed: int
    groups_reused: int
    tokens: int = 0
    compute_seconds: float = 0.0
    workers: int | None = None
    dim_in: int | None = None
    dim_out: int | None = None
    wall_seconds: float | None = None
    tokens_per_second: float | None = None
    grpo: dict | None = None

    def to_dict(self) -> dict:
        """As summary.json holds it (fields of a stage that computed nothing are left out)."""
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass(frozen=True, eq=False)
class FeaturizeResult:
    """The stage's result: where every candidate's vector lives (blocks in Ray's object store, by file), the
    target's vector, and the stats. The driver holds no candidate vector."""

    names: list[str]
    blocks: list[BlockRows]
    refs: dict[str, ray.ObjectRef]
    g_tar: np.ndarray
    stats: FeaturizeStats

    @classmethod
    def of(cls, names: list[str], found: dict[str, tuple[str, int]], refs: dict[str, ray.ObjectRef],
           nodes: dict[str, tuple[str | None, int]], stats: FeaturizeStats) -> FeaturizeResult:
        """The result for candidates `names` whose rows are `found` (group -> (block file, row)) in blocks `refs`
        living on `nodes` (file -> (node, bytes)); the target's row is fetched, nothing else."""
        blocks = rows_of_blocks(names, found, nodes)
        file, row = found[TARGET_KEY]
        g_tar = np.asarray(ray.get(refs[file])[row], np.float64)
        return cls(names=names, blocks=blocks, refs=refs, g_tar=g_tar, stats=stats)


def fingerprint(cfg: RunConfig, model_digest: str) -> dict:
    """What stored vectors depend on besides each group's preview (that is in the per-group key)."""
    # transformers (seconds to import): only for its version in a run's fingerprint
    import transformers

    f = cfg.features
    prefix = {"task_vector": "tv_", "grpo": "grpo_"}.get(f.representation)
    # the metric is applied to stored vectors later, so vectors do not depend on it;
    # format 2: the CountSketch hash is drawn block by block (vectors of format 1 differ)
    features = {"representation": f.representation, "format": 2, "keep_per_example": f.keep_per_example} | {
        k: v for k, v in asdict(f).items() if prefix and k.startswith(prefix)}
    return {
        "features": features,
        "parameters": "full" if f.parameters == "full" else
        ("lora_A+lora_B" if f.representation == "task_vector" else "lora_B"),
        "model": cfg.model.source,
        "model_digest": model_digest,  # the weights, config and tokenizer, not the folder's name
        "transformers": transformers.__version__,
        "dtype": cfg.model.dtype,
        "max_length": cfg.model.max_length,
        "lora": asdict(cfg.lora) | {"dropout": 0.0},
        "projection": asdict(cfg.projection),
    }


def featurize(cfg: RunConfig, spec: ReplicaSpec, data: PreparedData, store: VectorStore, progress: Progress,
              work: tuple[WorkItem, list[WorkItem]] | None = None, stage: str = "featurize") -> FeaturizeResult:
    """Compute (or reuse from the store) every group's projected gradient; the blocks stay in the object store.
    work: (target, candidates) items other than the previews (a task vector's whole groups); stage: its name in
    the progress record."""
    items = [data.target_item] + data.items if work is None else [work[0], *work[1]]
    keys = {it.name: preview_key(it) for it in items}
    done = store.done()
    todo = [it for it in items if done.get(it.name) != keys[it.name]]
    reused = [it.name for it in items if done.get(it.name) == keys[it.name]]
    progress.total(stage, len(items))
    stats = FeaturizeStats(groups_computed=len(todo), groups_reused=len(reused))
    found: dict[str, tuple[str, int]] = {}  # group -> (block file, row)
    refs: dict[str, ray.ObjectRef] = {}
    nodes: dict[str, tuple[str | None, int]] = {}  # block file -> (node of its array, bytes)
    if reused:
        reuse_blocks(store, reused, keys, found, refs, nodes)
        lost = [it for it in items if it.name in set(reused) and it.name not in found]
        todo += lost  # in a block that failed its checksum when read back: computed again
        reused = [n for n in reused if n in found]
        stats.groups_computed, stats.groups_reused = len(todo), len(reused)
        progress.advance(stage, len(reused))
        log.info("resumed %d stored group vectors", len(reused))
    if todo:
        _compute(cfg, spec, todo, keys, store, progress, stats, found, refs, nodes, stage)
    store.mark_complete([it.name for it in items])
    return FeaturizeResult.of(data.names(), found, refs, nodes, stats)


def reuse_blocks(store: VectorStore, reused: list[str], keys: dict[str, str], found: dict, refs: dict,
           nodes: dict) -> None:
    """Stored blocks holding the reused groups, each read into the object store by a task on a node that reaches
    the store (the driver's node for a local folder)."""
    wanted = set(reused)
    local = store.folder.local is not None
    here = ray.get_runtime_context().get_node_id()
    opts = {"scheduling_strategy": NodeAffinitySchedulingStrategy(here, soft=False)} if local else {}
    pending = []
    for meta in store.blocks_of(reused):
        rows = [(g, r) for r, (g, k) in enumerate(zip(meta.groups, meta.keys)) if g in wanted and keys[g] == k
                and g not in found]
        if rows:
            pending.append((meta, rows, *load_block.options(**opts).remote(store.folder, meta)))
            found.update((g, (meta.file, r)) for g, r in rows)
    for meta, rows, error, array in pending:
        why = ray.get(error)
        if why is not None:  # damaged since it was written: set aside, its groups go back to the work list
            store.set_aside(meta, "checksum mismatch when read back")
            for g, _ in rows:
                found.pop(g, None)
            continue
        refs[meta.file] = array
        nodes[meta.file] = (here if local else None, meta.size)


def _compute(cfg: RunConfig, spec: ReplicaSpec, todo: list, keys: dict[str, str], store: VectorStore,
             progress: Progress, stats: FeaturizeStats, found: dict, refs: dict, nodes: dict,
             stage: str = "featurize") -> None:
    """Featurise the groups `todo` on a pool of gradient workers; each worker stores its own blocks where it can
    reach the store (else the driver writes them), and each block's array stays in Ray's object store."""
    blocks = plan_blocks(todo, cfg.ray.groups_per_call)
    grpo = {"prompts": 0, "zero_advantage_prompts": 0, "reward_sum": 0.0}
    opts = {"num_cpus": cfg.ray.cpus_per_worker, "num_gpus": cfg.ray.gpus_per_worker}
    here = ray.get_runtime_context().get_node_id()
    target = StoreTarget(store.folder, here if store.folder.local is not None else None)
    arrays: dict[int, ray.ObjectRef] = {}

    def call(worker, block):
        meta_ref, array_ref = worker.featurize.remote(block, [keys[it.name] for it in block], target, progress.actor)
        arrays[id(block)] = array_ref
        return meta_ref

    with ActorPool(GradientWorker, min(cfg.ray.workers, len(blocks)), spec, progress.name, options=opts,
                   name="convalue-grad") as pool:
        info = pool.probe("info", "gradient worker")
        stats.workers, stats.dim_in, stats.dim_out = len(pool), info["dim_in"], info["dim_out"]
        log.info("%d gradient workers; %d featurised parameters (%s) -> projected to %d",
                 len(pool), info["dim_in"], cfg.features.representation, info["dim_out"])
        t0 = time.perf_counter()
        finished = 0
        for block, out in pool.map(blocks, call, cfg.ray.max_in_flight, cost=block_tokens):
            ref = arrays.pop(id(block))
            meta = out.meta
            if meta is None:  # the worker cannot reach the store: the driver writes this block
                meta = write_block(store.folder, out.names, [keys[n] for n in out.names],
                                   [len(it.examples) for it in block], [block_tokens([it]) for it in block],
                                   ray.get(ref), out.per_example)
            store.add(meta, info["dim_out"])
            refs[meta.file], nodes[meta.file] = ref, (out.node, meta.size)
            found.update((n, (meta.file, r)) for r, n in enumerate(out.names))
            stats.tokens += out.stats["tokens"]
            stats.compute_seconds += out.stats["seconds"]
            for k in grpo if "grpo" in out.stats else ():
                grpo[k] += out.stats["grpo"][k]
            finished += len(out.names)
            progress.advance(stage, len(out.names), tokens=out.stats["tokens"])
            log.info("featurised %d/%d groups (%s)", finished, len(todo), ", ".join(out.names))
    wall = time.perf_counter() - t0
    stats.wall_seconds = round(wall, 3)
    stats.tokens_per_second = round(stats.tokens / wall, 1) if wall > 0 else None
    if cfg.features.representation == "grpo":
        stats.grpo = {"prompts": grpo["prompts"], "zero_advantage_prompts": grpo["zero_advantage_prompts"],
                      "mean_reward": round(grpo["reward_sum"] / max(grpo["prompts"], 1), 4)}
