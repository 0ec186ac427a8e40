"""What a fine-tune is judged by: a metric (loss or accuracy) on a named evaluation, and how a protocol row
carries each evaluation's value."""

from __future__ import annotations

from dataclasses import dataclass

from convalue.engine.config.settings import METRICS
from convalue.engine.config.sources import TARGET_VAL, measure_parts

#: the row fields that hold the target's validation split's values, as every row has carried them
TARGET_VAL_FIELDS = {"loss": "val_loss", "accuracy": "val_accuracy"}


@dataclass(frozen=True)
class EvalScore:
    """A model's values on one evaluation: its response-token loss and, where measured, its accuracy."""

    loss: float
    accuracy: float | None = None


@dataclass(frozen=True)
class Measure:
    """A metric on a named evaluation: `heldout:loss`, `target_val:accuracy`."""

    evaluation: str = TARGET_VAL
    metric: str = "loss"

    def __post_init__(self) -> None:
        if self.metric not in METRICS:
            raise ValueError(f"unknown metric {self.metric!r}; expected one of {list(METRICS)}")

    @classmethod
    def parse(cls, text: str) -> Measure:
        """finetune.select_by's `EVAL:METRIC` (a bare metric: on the target's validation split)."""
        return cls(*measure_parts(text))

    @classmethod
    def of_evaluation(cls, evaluation: dict) -> Measure:
        """The measure a summary's evaluation record was judged by: its select_by (older summaries: their metric
        on the target's validation split)."""
        return cls.parse(str(evaluation.get("select_by") or evaluation.get("metric") or "loss"))

    @property
    def name(self) -> str:
        """`evaluation:metric`, as finetune.select_by writes it."""
        return f"{self.evaluation}:{self.metric}"

    @property
    def lower_is_better(self) -> bool:
        """Whether a lower value is better (the loss) or a higher one (accuracy)."""
        return self.metric == "loss"

    @property
    def words(self) -> str:
        """The measure in a table's heading: `loss on heldout`."""
        return f"{self.metric} on {self.evaluation}"

    def value(self, row: dict) -> float | None:
        """A protocol row's value (None where the row has none): the target's validation split's from its own
        fields, another evaluation's from the row's `evaluations`."""
        if self.evaluation == TARGET_VAL:
            return row.get(TARGET_VAL_FIELDS[self.metric])
        return ((row.get("evaluations") or {}).get(self.evaluation) or {}).get(self.metric)

    def base(self, row: dict) -> float | None:
        """The base model's value as a row carries it (None where not measured)."""
        if self.evaluation == TARGET_VAL:
            return row.get(f"base_{TARGET_VAL_FIELDS[self.metric]}")
        return ((row.get("base_evaluations") or {}).get(self.evaluation) or {}).get(self.metric)
