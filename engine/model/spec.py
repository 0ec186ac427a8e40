"""ReplicaSpec: what a Ray worker needs to build a model replica (a gradient worker or a fine-tune job)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from convalue.engine.config import (
    FeaturesConfig,
    FinetuneConfig,
    LoraConfig,
    ModelConfig,
    ProjectionConfig,
)


@dataclass(frozen=True)
class ReplicaSpec:
    """The resolved model folder and the config sections a replica is built from, with its device and threads."""

    model_dir: str
    model: ModelConfig
    lora: LoraConfig
    features: FeaturesConfig
    projection: ProjectionConfig
    finetune: FinetuneConfig
    pad_id: int
    threads: int = 1
    device: str = "cpu"
    model_digest: str = ""  # the content hash of model_dir's weights, config and tokenizer (engine.model.digest)

    @classmethod
    def from_config(cls, cfg: Any, model_dir: Path, pad_id: int, model_digest: str = "") -> ReplicaSpec:
        """The spec of a run config (cfg: RunConfig) with its resolved model folder, its content hash and the
        tokenizer's pad id."""
        return cls(model_dir=str(model_dir), model=cfg.model, lora=cfg.lora, features=cfg.features,
                   projection=cfg.projection, finetune=cfg.finetune, pad_id=pad_id, threads=cfg.ray.cpus_per_worker,
                   device="cuda" if cfg.ray.gpus_per_worker > 0 else "cpu", model_digest=model_digest)

    def for_job(self, seed: int, rho: float | None = None) -> ReplicaSpec:
        """The spec of one fine-tune job: the finetune section with its seed (and its rho_k where it has one)."""
        changes: dict[str, Any] = {"seed": seed} | ({} if rho is None else {"rho": rho})
        return dataclasses.replace(self, finetune=dataclasses.replace(self.finetune, **changes))
