"""GradientWorker: a Ray actor holding one model replica + LoRA adapter + projector."""

from __future__ import annotations

import os
import time

import numpy as np
import ray

from convalue.actors.pool import DeferredStartup
from convalue.actors.progress import report_attempt
from convalue.engine.config import ConfigError
from convalue.engine.features.batching import WorkItem
from convalue.engine.features.grpo import GrpoError
from convalue.engine.features.projection import ProjectionError
from convalue.engine.features.rewards import RewardError
from convalue.engine.model.loading import ModelError
from convalue.engine.model.spec import ReplicaSpec

USER_ERRORS = (ConfigError, ModelError, ProjectionError, GrpoError, RewardError)  # what a replica's inputs can raise


class GradientWorkerImpl(DeferredStartup):
    """Loads theta_0 (with a seeded LoRA adapter, unless full-parameter) once; returns projected group vectors."""

    def __init__(self, spec: ReplicaSpec, progress: object | None = None):
        import torch

        from convalue.engine.features.replica import build_featurizer

        report_attempt(progress, "featurize", None)  # a second process of this actor: a restart
        torch.set_num_threads(spec.threads)
        t0 = time.perf_counter()
        self.grads = self._start(lambda: build_featurizer(spec), USER_ERRORS)
        self.load_seconds = time.perf_counter() - t0

    def info(self) -> dict:
        """Dimensions and identity of this replica."""
        self._ready()
        return {"pid": os.getpid(), "dim_in": self.grads.dim, "dim_out": self.grads.projector.dim_out,
                "load_seconds": self.load_seconds}

    def featurize(self, items: list[WorkItem], progress: object | None = None,
                  ) -> tuple[list[str], np.ndarray, dict, list[np.ndarray] | None]:
        """(names, [len(items), p] block, stats, per-example [m_i, p] blocks or None) for one block of groups;
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
        return [it.name for it in items], block, stats, per_example


# Gradient calls are pure functions of (model, group): retrying them is safe (at-least-once),
# and a restarted actor rebuilds its replica from the model path.
GradientWorker = ray.remote(max_restarts=2, max_task_retries=2)(GradientWorkerImpl)
