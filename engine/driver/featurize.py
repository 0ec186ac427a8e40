"""The featurisation stage: every group's projected gradient, computed on GradientWorker actors (or read back
from the run's vector store), written block by block to the store."""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass

import numpy as np

from convalue.actors.gradient_worker import GradientWorker
from convalue.actors.pool import ActorPool
from convalue.actors.progress import Progress
from convalue.engine.config import RunConfig
from convalue.engine.data.prepare import TARGET_KEY, PreparedData, preview_key
from convalue.engine.features.batching import block_tokens, plan_blocks
from convalue.engine.model.spec import ReplicaSpec
from convalue.engine.store.vectors import VectorStore

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
    """The stage's result: every candidate's vector in `names` order, the target's, and the stats."""

    names: list[str]
    G: np.ndarray
    g_tar: np.ndarray
    stats: FeaturizeStats


def fingerprint(cfg: RunConfig, model_digest: str) -> dict:
    """What stored vectors depend on besides each group's preview (that is in the per-group key)."""
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


def featurize(cfg: RunConfig, spec: ReplicaSpec, data: PreparedData, store: VectorStore,
              progress: Progress) -> FeaturizeResult:
    """Compute (or reuse from the store) every group's projected gradient."""
    items = [data.target_item] + data.items
    keys = {it.name: preview_key(it) for it in items}
    done = store.done()
    todo = [it for it in items if done.get(it.name) != keys[it.name]]
    reused = [it.name for it in items if done.get(it.name) == keys[it.name]]
    progress.total("featurize", len(items))
    progress.advance("featurize", len(reused))
    rows: dict[str, np.ndarray] = {}
    if reused:
        X, _ = store.load(reused)
        rows.update(zip(reused, X))
        log.info("resumed %d stored group vectors", len(reused))
    stats = FeaturizeStats(groups_computed=len(todo), groups_reused=len(reused))
    if todo:
        _compute(cfg, spec, todo, keys, store, progress, stats, rows)
    store.mark_complete([it.name for it in items])
    names = data.names()
    return FeaturizeResult(names=names, G=np.stack([rows[n] for n in names]), g_tar=rows[TARGET_KEY], stats=stats)


def _compute(cfg: RunConfig, spec: ReplicaSpec, todo: list, keys: dict[str, str], store: VectorStore,
             progress: Progress, stats: FeaturizeStats, rows: dict[str, np.ndarray]) -> None:
    """Featurise the groups `todo` on a pool of gradient workers, storing each block as it arrives."""
    blocks = plan_blocks(todo, cfg.ray.groups_per_call)
    grpo = {"prompts": 0, "zero_advantage_prompts": 0, "reward_sum": 0.0}
    opts = {"num_cpus": cfg.ray.cpus_per_worker, "num_gpus": cfg.ray.gpus_per_worker}
    with ActorPool(GradientWorker, min(cfg.ray.workers, len(blocks)), spec, progress.actor, options=opts,
                   name="convalue-grad") as pool:
        info = pool.probe("info", "gradient worker")
        stats.workers, stats.dim_in, stats.dim_out = len(pool), info["dim_in"], info["dim_out"]
        log.info("%d gradient workers; %d featurised parameters (%s) -> projected to %d",
                 len(pool), info["dim_in"], cfg.features.representation, info["dim_out"])
        t0 = time.perf_counter()
        finished = 0
        for block, (names, X, st, per_example) in pool.map(
                blocks, lambda w, b: w.featurize.remote(b, progress.actor), cfg.ray.max_in_flight, cost=block_tokens):
            store.write_block(names, [keys[n] for n in names], [len(it.examples) for it in block],
                              [block_tokens([it]) for it in block], X, per_example)
            rows.update(zip(names, X))
            stats.tokens += st["tokens"]
            stats.compute_seconds += st["seconds"]
            for k in grpo if "grpo" in st else ():
                grpo[k] += st["grpo"][k]
            finished += len(names)
            progress.advance("featurize", len(names), tokens=st["tokens"])
            log.info("featurised %d/%d groups (%s)", finished, len(todo), ", ".join(names))
    wall = time.perf_counter() - t0
    stats.wall_seconds = round(wall, 3)
    stats.tokens_per_second = round(stats.tokens / wall, 1) if wall > 0 else None
    if cfg.features.representation == "grpo":
        stats.grpo = {"prompts": grpo["prompts"], "zero_advantage_prompts": grpo["zero_advantage_prompts"],
                      "mean_reward": round(grpo["reward_sum"] / max(grpo["prompts"], 1), 4)}

