"""RunConfig: a whole valuation run, its sections and the checks that span them."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from convalue.engine.config.analysis import FaithfulnessConfig, TransferConfig
from convalue.engine.config.fields import ConfigError, check_writable, opt
from convalue.engine.config.inputs import (
    DataConfig,
    FeaturesConfig,
    LoraConfig,
    ModelConfig,
    ProjectionConfig,
)
from convalue.engine.config.settings import (
    BootstrapConfig,
    FinetuneConfig,
    RayConfig,
    SelectConfig,
)
from convalue.engine.config.solver import SolverConfig
from convalue.engine.config.sources import TARGET_VAL


@dataclass(kw_only=True)
class RunConfig:
    """A whole valuation run."""

    name: str = opt("run", "Run name; outputs go to `<out>/<name>/`.")
    out: str = opt("runs", "Parent folder of run folders: a local folder (a relative one is read against the config "
                           "file's folder; `convalue run --out` against the current directory) or a filesystem URI "
                           "(`s3://bucket/runs`, `gs://...`, `hdfs://...`).")
    model: ModelConfig = opt(help="Base model.", factory=ModelConfig)
    lora: LoraConfig = opt(help="LoRA adapter.", factory=LoraConfig)
    features: FeaturesConfig = opt(help="Group representation.", factory=FeaturesConfig)
    data: DataConfig = opt(help="Target and candidates.")
    projection: ProjectionConfig = opt(help="Gradient projection.", factory=ProjectionConfig)
    solver: SolverConfig = opt(help="KMM solver.", factory=lambda: SolverConfig(gamma=0.05))
    select: SelectConfig = opt(help="Selection.", factory=SelectConfig)
    finetune: FinetuneConfig = opt(help="Evaluation fine-tunes.", factory=FinetuneConfig)
    bootstrap: BootstrapConfig = opt(help="Score uncertainty by bootstrap over the previews.",
                                     factory=BootstrapConfig)
    ray: RayConfig = opt(help="Ray cluster and workers.", factory=RayConfig)
    faithfulness: FaithfulnessConfig = opt(help="`convalue faithfulness`: subset faithfulness.",
                                           factory=FaithfulnessConfig)
    transfer: TransferConfig = opt(help="`convalue transfer`: pairwise transfer.", factory=TransferConfig)

    def validate(self) -> None:
        """Raise ConfigError naming the first field, or combination of sections, that does not hold."""
        if not self.name or "/" in self.name or self.name in (".", ".."):
            raise ConfigError("must be a plain folder name", field="name", value=self.name)
        if "://" in self.out:  # a filesystem URI (s3://, gs://, hdfs://, ...): reached when the run writes it
            return self._validate_sections()
        run_dir = Path(self.out).expanduser() / self.name
        existing = next(q for q in (run_dir, *run_dir.parents) if q.exists())  # the nearest existing path
        if not existing.is_dir():
            raise ConfigError(f"the run folder {run_dir} cannot be made: {existing} is a file", field="out",
                              value=self.out)
        check_writable(existing, "out", self.out)
        self._validate_sections()

    def _validate_sections(self) -> None:
        """The checks that span sections."""
        if self.features.keep_per_example and (self.features.representation != "one_step"
                                               or self.features.parameters != "lora"
                                               or self.model.token_budget is None):
            raise ConfigError("needs representation `one_step`, parameters `lora` and a model.token_budget "
                              "(per-example gradients come from the packed path's hooks)",
                              field="features.keep_per_example", value=True)
        if self.bootstrap.samples > 0 and not self.features.keep_per_example:
            raise ConfigError("resamples the previews' per-example vectors: set features.keep_per_example: true",
                              field="bootstrap.samples", value=self.bootstrap.samples)
        if self.features.parameters == "full" and self.projection.kind == "identity":
            raise ConfigError("full-parameter gradients need a compressing projection (`countsketch`, `rademacher` "
                              "or `gaussian`): one identity vector per group would be the size of the model",
                              field="projection.kind", value=self.projection.kind)
        evaluation, _ = self.finetune.select_by_parts()
        if evaluation != TARGET_VAL and evaluation not in (self.data.eval or {}):
            raise ConfigError(f"names the evaluation {evaluation!r}, which is neither `{TARGET_VAL}` nor one of "
                              f"data.eval {sorted(self.data.eval or {})}", field="finetune.select_by",
                              value=self.finetune.select_by)
        tuned, _ = self.finetune.tune.measure_parts()
        if self.finetune.tune.enabled and tuned != TARGET_VAL and tuned not in (self.data.eval or {}):
            raise ConfigError(f"names the evaluation {tuned!r}, which is neither `{TARGET_VAL}` nor one of data.eval "
                              f"{sorted(self.data.eval or {})}", field="finetune.tune.by", value=self.finetune.tune.by)
        if self.data.eval and self.finetune.strategy == "deepspeed":
            raise ConfigError("is measured by the `task` strategy's jobs only (a DeepSpeed job evaluates the "
                              "target's validation split)", field="data.eval", value=sorted(self.data.eval))
        if stray := sorted(set(self.finetune.rho_by_k or {}) - set(self.evaluation_ks())):
            raise ConfigError(f"names budgets that are not evaluated (the budgets are {self.evaluation_ks()}: "
                              "finetune.ks, or select.k)", field=f"finetune.rho_by_k.{stray[0]}",
                              value=self.finetune.rho_by_k[stray[0]])

    def evaluation_ks(self) -> list[int]:
        """The evaluation protocol's budgets: finetune.ks ascending, or select.k alone."""
        return sorted(self.finetune.ks or [self.select.k])

    def to_dict(self) -> dict:
        """The config as plain data (for summary.json and for sending to actors)."""
        return dataclasses.asdict(self)
