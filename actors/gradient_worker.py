"""GradientWorker: a Ray actor holding one model replica + LoRA adapter + projector."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import numpy as np
import ray

from convalue.actors.pool import DeferredStartup
from convalue.actors.progress import find_progress, report_attempt
from convalue.engine.config import ConfigError
from convalue.engine.data.tokenize import WorkItem
from convalue.engine.features.batching import block_tokens
from convalue.engine.features.grpo import GrpoError
from convalue.engine.features.projection import ProjectionError
from convalue.engine.features.replica import build_featurizer
from convalue.engine.features.rewards import RewardError
from convalue.engine.files.folder import RunFolder
from convalue.engine.model.loading import ModelError
from convalue.engine.model.spec import ReplicaSpec
from convalue.engine.store.vectors import BlockMeta, write_block

USER_ERRORS = (ConfigError, ModelError, ProjectionError, GrpoError, RewardError)  # what a replica's inputs can raise


@dataclass(frozen=True)
class StoreTarget:
    """Where workers write their blocks: the run's vector folder, reachable from every node (a shared filesystem
    or URI: node None) or only from the driver's node (a local folder)."""

    folder: RunFolder
    node: str | None = None

    def reachable_from(self, node: str) -> bool:
        """Whether a worker on `node` can write to the folder."""
        return self.node is None or self.node == node


@dataclass
class FeaturizedBlock:
    """What a worker tells the driver about one block: its groups, the stored block's metadata (None where the
    driver must write it: then per_example travels here), the compute stats and the worker's node."""

    names: list[str]
    meta: BlockMeta | None
    stats: dict
    node: str
    per_example: list[np.ndarray] | None = None


class GradientWorkerImpl(DeferredStartup):
    """Loads theta_0 (with a seeded LoRA adapter, unless full-parameter) once; returns projected group vectors."""

    def __init__(self, spec: ReplicaSpec, progress: str | None = None):
        # torch: only on a worker that runs the model; the driver imports this module without it
        import torch

        # progress: the run's progress actor's name (a handle here would put the arguments in the object store)
        report_attempt(find_progress(progress), "featurize", None)  # a second process of this actor: a restart
        torch.set_num_threads(spec.threads)
        t0 = time.perf_counter()
        self.grads = self._start(lambda: build_featurizer(spec), USER_ERRORS)
        self.load_seconds = time.perf_counter() - t0

    def info(self) -> dict:
        """Dimensions and identity of this replica."""
        self._ready()
        return {"pid": os.getpid(), "dim_in": self.grads.dim, "dim_out": self.grads.projector.dim_out,
                "load_seconds": self.load_seconds}

    @ray.method(num_returns=2)
    def featurize(self, items: list[WorkItem], keys: list[str], target: StoreTarget | None = None,
                  progress: object | None = None) -> tuple[FeaturizedBlock, np.ndarray]:
        """(what was computed, the [len(items), p] block) for one block of groups (keys: their preview keys). With a
        store target this worker can reach, the worker writes the block there itself (the driver gets metadata);
        progress: the run's progress actor, told where the block is computed (retries are counted there)."""
        report_attempt(progress, "featurize", "+".join(it.name for it in items))
        self._ready()
        tokens0, sec0 = self.grads.tokens, self.grads.seconds
        block = self.grads.featurize(items)
        stats = {"tokens": self.grads.tokens - tokens0, "seconds": self.grads.seconds - sec0, "pid": os.getpid()}
        if hasattr(self.grads, "stats"):  # GRPO: prompts, reward sum, prompts whose rewards were all equal
            stats["grpo"] = dict(self.grads.stats)
        kept = getattr(self.grads, "per_example", None)  # only GroupGradients keeps per-example vectors
        per_example = [kept.pop(it.name) for it in items] if kept else None
        names, node = [it.name for it in items], ray.get_runtime_context().get_node_id()
        meta = None
        if target is not None and target.reachable_from(node):
            meta = write_block(target.folder, names, keys, [len(it.examples) for it in items],
                               [block_tokens([it]) for it in items], block, per_example)
            per_example = None
        return FeaturizedBlock(names=names, meta=meta, stats=stats, node=node, per_example=per_example), block


# Gradient calls are pure functions of (model, group): retrying them is safe (at-least-once),
# and a restarted actor rebuilds its replica from the model path.
GradientWorker = ray.remote(max_restarts=2, max_task_retries=2)(GradientWorkerImpl)
