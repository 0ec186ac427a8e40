"""The section that tunes Alg. 1's target-mixing ratio rho_k per budget on an evaluation that is not the reported
one (finetune.tune)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from convalue.engine.config.fields import ConfigError, opt
from convalue.engine.config.sources import TARGET_VAL, measure_parts

if TYPE_CHECKING:  # the section that holds this one
    from convalue.engine.config.settings import FinetuneConfig


@dataclass(kw_only=True)
class RhoTuningConfig:
    """Alg. 1's rho_k per budget, chosen from a grid on another evaluation and other seeds than those reported."""

    rho: list[float] = opt(
        help="The grid of target-mixing ratios tried at every budget k, e.g. [0.25, 0.5, 0.75]; empty: no tuning "
        "(finetune.rho and rho_by_k hold). Every method is fine-tuned at every k under every ratio with `repeats` "
        "tuning seeds of its own; rho_k is the ratio whose mean over the methods that buy at k is best on `by`, the "
        "same for every method, and the reported fine-tunes (finetune.seed ...) then train with it: neither their "
        "evaluation nor their seeds chose it.",
        factory=list)
    by: str = opt(f"{TARGET_VAL}:loss", "The measure that chooses rho_k, `EVAL:METRIC` as finetune.select_by writes "
                                        "it (a bare metric: on target_val); its evaluation must differ from "
                                        "select_by's, which reports the result.")
    repeats: int = opt(1, "Tuning seeds, after the reported ones: finetune.seed + finetune.repeats and the next "
                          "repeats - 1, so no reported fine-tune is one that chose rho_k.")

    def validate(self) -> None:
        """Raise ConfigError naming the first field whose value does not hold."""
        for i, r in enumerate(self.rho):
            if not (math.isfinite(r) and 0 <= r <= 1):
                raise ConfigError("must list ratios in [0, 1]", field=f"rho.{i}", value=r)
        if len(set(self.rho)) != len(self.rho) or len(self.rho) == 1:
            raise ConfigError("must list at least two distinct ratios to choose from (or none: no tuning)",
                              field="rho", value=self.rho)
        if self.repeats <= 0:
            raise ConfigError("must be >= 1", field="repeats", value=self.repeats)
        evaluation, _ = self.measure_parts()
        if not evaluation:
            raise ConfigError("must be EVAL:METRIC, e.g. `target_val:loss`, or a bare metric", field="by",
                              value=self.by)

    @property
    def enabled(self) -> bool:
        """Whether rho_k is tuned (a grid is given)."""
        return bool(self.rho)

    def measure_parts(self) -> tuple[str, str]:
        """(evaluation, metric) of `by` (a bare metric: on target_val)."""
        return measure_parts(self.by)

    def validate_within(self, ft: FinetuneConfig) -> None:
        """The checks that read the rest of the finetune section (fields named from finetune.)."""
        if ft.rho_by_k:
            raise ConfigError("and rho_by_k both give rho_k: keep one", field="tune.rho", value=self.rho)
        if ft.budget == "additive" and min(self.rho) <= 0:
            raise ConfigError("must be > 0 with budget `additive`", field="tune.rho", value=self.rho)
        if ft.strategy == "deepspeed":
            raise ConfigError("needs an evaluation besides select_by's (data.eval), which `deepspeed` jobs do not "
                              "measure: tune with strategy `task`", field="tune.rho", value=self.rho)
        evaluation, metric = self.measure_parts()
        if metric not in ft.metrics:
            raise ConfigError(f"must name a metric of finetune.metrics {ft.metrics}", field="tune.by", value=self.by)
        if evaluation == ft.select_by_parts()[0]:
            raise ConfigError(f"must name another evaluation than select_by's ({ft.select_by}): a ratio chosen on "
                              "the reported evaluation would flatter it", field="tune.by", value=self.by)
