"""The run's one verdict: is KMM's selection worth buying? Read once from the paired interval, on the select_by
evaluation, of KMM's selection at its best k against the target alone, and then only repeated: summary.json, the
CLI summary, `convalue status` (verdict_line) and report.html's opening line all say the same.

`buy`: the selection beats the target alone beyond noise (the interval of its advantage lies above 0);
`do not buy`: the target alone beats it beyond noise (below 0); `no resolvable difference`: the interval holds 0,
or one seed gives none; `not evaluated`: no fine-tune compared them, so the ranking stands alone."""

from __future__ import annotations

from dataclasses import dataclass

from convalue.engine.protocol.measures import Measure
from convalue.engine.protocol.summaries import MeasureSummary

BUY, NO_DIFFERENCE, DO_NOT_BUY, NOT_EVALUATED = "buy", "no resolvable difference", "do not buy", "not evaluated"
KINDS = (BUY, NO_DIFFERENCE, DO_NOT_BUY, NOT_EVALUATED)


@dataclass(frozen=True)
class Verdict:
    """The verdict and what it rests on: the evaluation and metric, KMM's best k and what it buys there, the
    selection's advantage over the target alone (positive: the selection is better; for the loss, the target
    alone's minus the selection's) with its paired 95 % interval, the seeds, and the sentence that says it."""

    kind: str
    sentence: str
    evaluation: str | None = None
    metric: str | None = None
    k: int | None = None
    groups: tuple[str, ...] = ()
    difference: float | None = None
    interval: tuple[float, float] | None = None
    seeds: int = 0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown verdict {self.kind!r}; expected one of {list(KINDS)}")

    def line(self) -> str:
        """The verdict in one line, as the CLI and `convalue status` print it."""
        return f"verdict: {self.kind} — {self.sentence}"

    def to_dict(self) -> dict:
        """As summary.json's evaluation.verdict holds it."""
        return {"kind": self.kind, "sentence": self.sentence, "evaluation": self.evaluation, "metric": self.metric,
                "k": self.k, "groups": list(self.groups), "difference": self.difference,
                "interval": None if self.interval is None else list(self.interval), "seeds": self.seeds}

    @classmethod
    def from_dict(cls, data: dict) -> Verdict:
        """The verdict summary.json holds (ValueError where it is not one)."""
        if not isinstance(data, dict) or not isinstance(data.get("kind"), str):
            raise ValueError("not a verdict record")
        interval = data.get("interval")
        return cls(kind=data["kind"], sentence=str(data.get("sentence") or ""), evaluation=data.get("evaluation"),
                   metric=data.get("metric"), k=data.get("k"), groups=tuple(data.get("groups") or ()),
                   difference=data.get("difference"),
                   interval=None if interval is None else (float(interval[0]), float(interval[1])),
                   seeds=int(data.get("seeds") or 0))


def classify(interval: tuple[float, float] | None) -> str:
    """The verdict an interval of the selection's advantage gives: `buy` entirely above 0, `do not buy` entirely
    below, `no resolvable difference` holding 0 or absent (one seed)."""
    if interval is None:
        return NO_DIFFERENCE
    low, high = interval
    return BUY if low > 0 else DO_NOT_BUY if high < 0 else NO_DIFFERENCE


def not_evaluated(reason: str = "no fine-tune ran (finetune.enabled is false)") -> Verdict:
    """The verdict of a run that compared no selection with the target alone."""
    return Verdict(NOT_EVALUATED, f"{reason}: KMM's ranking stands alone, untested against training on the target "
                                  "alone.")


def judge(measure: Measure, k: int, groups: list[str] | tuple[str, ...], mean: float,
          ci95: tuple[float, float] | list[float] | None, seeds: int) -> Verdict:
    """The verdict of KMM's selection at its best k (`groups`) on `measure`, from KMM's value minus the target
    alone's there (mean and paired 95 % interval over `seeds`)."""
    flip = -1.0 if measure.lower_is_better else 1.0  # the selection's advantage: lower loss, higher accuracy
    diff = flip * mean
    interval = None if ci95 is None else tuple(sorted((flip * ci95[0], flip * ci95[1])))
    kind = classify(interval)
    bought = f"KMM's selection at its best k = {k} ({', '.join(groups)})" if groups else \
        f"KMM's selection at its best k = {k} (which buys nothing: the target alone)"
    better = "lower" if measure.lower_is_better else "higher"
    evidence = (f"the selection's advantage {diff:+.4f}" + ("" if interval is None else
                f" [95% CI {interval[0]:+.4f}, {interval[1]:+.4f}]")
                + f", {measure.metric} on {measure.evaluation} ({better} is better), {seeds} seed(s)")
    if kind == BUY:
        text = f"on {measure.evaluation}, {bought} beats the target alone beyond noise ({evidence}): buy it."
    elif kind == DO_NOT_BUY:
        text = (f"on {measure.evaluation}, the target alone beats {bought} beyond noise ({evidence}): train on "
                "the target alone.")
    elif interval is None:
        text = (f"on {measure.evaluation}, {bought} against the target alone: one seed gives no interval "
                f"({evidence}); set finetune.repeats to 3 or more to resolve it.")
    else:
        text = (f"on {measure.evaluation}, {bought} and the target alone do not differ beyond noise ({evidence}): "
                "the evaluation does not show that buying it pays.")
    return Verdict(kind, text, measure.evaluation, measure.metric, k, tuple(groups), diff,
                   None if interval is None else (float(interval[0]), float(interval[1])), seeds)


def verdict_of(summary: MeasureSummary) -> Verdict:
    """The verdict of the protocol's summary on the select_by measure."""
    best = summary.best_k.get("kmm")
    if best is None:
        return not_evaluated("KMM's selection was not fine-tuned")
    d = summary.paired("target_only", best.k)
    if d is None:
        return not_evaluated("the run has no target-only fine-tune to compare with (add target_only to "
                             "finetune.baselines)")
    return judge(summary.measure, best.k, best.groups, d.mean, d.ci95, d.seeds)


def verdict_from_evaluation(evaluation: dict | None) -> Verdict:
    """The verdict a summary.json's `evaluation` holds; for a summary written before verdicts were stored, the one
    its best k and paired differences give; `not evaluated` where there is no evaluation of a selection."""
    if not isinstance(evaluation, dict):
        return not_evaluated()
    if isinstance(evaluation.get("verdict"), dict):
        try:
            return Verdict.from_dict(evaluation["verdict"])
        except (ValueError, TypeError, IndexError):
            pass
    for analysis in ("faithfulness", "transfer"):
        if analysis in evaluation:
            return not_evaluated(f"this folder holds a `convalue {analysis}` analysis, which fine-tunes subsets, "
                                 "not the run's selection")
    best = (evaluation.get("best_k") or {}).get("kmm")
    if not isinstance(best, dict) or not isinstance(best.get("k"), int):
        return not_evaluated()
    try:
        measure = Measure.of_evaluation(evaluation)
    except ValueError:
        return not_evaluated("the evaluation names no metric this version knows")
    d = next((d for d in evaluation.get("kmm_minus") or [] if isinstance(d, dict)
              and d.get("method") == "target_only" and d.get("k") == best["k"]), None)
    if d is None or not isinstance(d.get("mean"), (int, float)):
        return not_evaluated("the run has no target-only fine-tune to compare with (add target_only to "
                             "finetune.baselines)")
    return judge(measure, best["k"], best.get("groups") or [], float(d["mean"]), d.get("ci95"),
                 int(d.get("seeds") or 0))


def verdict_line(summary_evaluation: dict | None) -> str:
    """The verdict of a summary.json's `evaluation` (None: a run without one) in one line, for `convalue status`."""
    return verdict_from_evaluation(summary_evaluation).line()
