"""The config sections of the fitted baselines (DataModel, GradEx) and of DeepSpeed fine-tune jobs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from convalue.engine.config.fields import ConfigError, opt


@dataclass(kw_only=True)
class DataModelConfig:
    """The fitted DataModel baselines (finetune.baselines `datamodel`, `datamodel_cs`; paper App. baselines)."""

    runs_per_candidate: float = opt(10.0, "Fine-tunes of random subsets per candidate group, per design (the "
                                          "paper's budget: 10 N); each is a fine-tune of finetune.steps steps.")
    rho: float = opt(0.5, "`datamodel`: the share of the candidates each random subset holds.")
    alpha_ratio: float = opt(0.01, "The LASSO's l1 strength as a fraction of the smallest one that zeroes every "
                                   "score.")
    seed: int = opt(0, "Seed of the designs.")

    def validate(self) -> None:
        """Raise ConfigError naming the first field whose value does not hold."""
        if not self.runs_per_candidate > 0:
            raise ConfigError("must be > 0", field="runs_per_candidate", value=self.runs_per_candidate)
        if not 0 < self.rho < 1:
            raise ConfigError("must be in (0, 1)", field="rho", value=self.rho)
        if not 0 < self.alpha_ratio < 1:
            raise ConfigError("must be in (0, 1)", field="alpha_ratio", value=self.alpha_ratio)


@dataclass(kw_only=True)
class DeepSpeedConfig:
    """One fine-tune job as a Ray Train TorchTrainer under DeepSpeed ZeRO (finetune.strategy `deepspeed`)."""

    workers: int = opt(2, "Training workers (processes; with `use_gpu`, one GPU each) of one fine-tune job.")
    use_gpu: bool = opt(True, "One GPU per worker (NCCL); false: CPU workers (gloo).")
    cpus_per_worker: int = opt(1, "CPUs (and torch threads) per training worker.")
    stage: int = opt(2, "ZeRO stage: 0 (plain data parallel), 1 (optimizer states), 2 (+ gradients), 3 (+ "
                        "parameters, built partitioned: no worker holds the whole model).")
    offload_optimizer: Literal["none", "cpu"] = opt("none", "`cpu`: optimizer states in host memory (stage >= 1).")
    offload_param: Literal["none", "cpu"] = opt("none", "`cpu`: parameters in host memory (stage 3).")

    def validate(self) -> None:
        """Raise ConfigError naming the first field whose value does not hold."""
        for name in ("workers", "cpus_per_worker"):
            if getattr(self, name) <= 0:
                raise ConfigError("must be > 0", field=name, value=getattr(self, name))
        if self.stage not in (0, 1, 2, 3):
            raise ConfigError("must be 0, 1, 2 or 3", field="stage", value=self.stage)
        if self.offload_optimizer == "cpu" and self.stage < 1:
            raise ConfigError("needs ZeRO stage 1 or more", field="offload_optimizer", value=self.offload_optimizer)
        if self.offload_param == "cpu" and self.stage != 3:
            raise ConfigError("needs ZeRO stage 3", field="offload_param", value=self.offload_param)


@dataclass(kw_only=True)
class GradExConfig:
    """The GradEx baselines (finetune.baselines `gradex_fs`, `gradex_re`; paper App. GradEx)."""

    projection_dim: int = opt(100, "Dimension the per-example log-odds gradients at theta* are projected to.")
    ridge: float = opt(1.0, "Ridge of the logistic surrogate, as a multiple of the mean squared feature norm (its "
                            "all-positive labels have no minimiser without one).")
    draws_per_candidate: float = opt(10.0, "`gradex_re`: random subsets per candidate (the paper's 10 N).")
    rho: float = opt(0.5, "`gradex_re`: the share of the candidates each random subset holds.")
    seed: int = opt(0, "Seed of the projection and the ensemble.")

    def validate(self) -> None:
        """Raise ConfigError naming the first field whose value does not hold."""
        if self.projection_dim <= 0:
            raise ConfigError("must be > 0", field="projection_dim", value=self.projection_dim)
        if not self.ridge > 0:
            raise ConfigError("must be > 0", field="ridge", value=self.ridge)
        if not self.draws_per_candidate > 0:
            raise ConfigError("must be > 0", field="draws_per_candidate", value=self.draws_per_candidate)
        if not 0 < self.rho < 1:
            raise ConfigError("must be in (0, 1)", field="rho", value=self.rho)
