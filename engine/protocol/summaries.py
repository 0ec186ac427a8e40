"""What the protocol's fine-tunes say on one measure (a metric on a named evaluation): each cell's mean over its
seeds, each method's best k, the Borda count over k, and KMM's paired differences from every other method with
their 95 % intervals (paper Sec. 5 and App., multi-seed results)."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from convalue.engine.protocol.measures import Measure

Cell = tuple[str, int | None]  # (method, k); k None: target only, the same at every k
TARGET_LOSS = Measure()  # the target's validation loss: what every row has measured


def borda_points(losses: dict[str, float]) -> dict[str, float]:
    """Borda points at one k: one per method with a strictly higher loss, half per tie (the paper's fractional
    counts)."""
    return {m: sum(1.0 if v < u else 0.5 if v == u else 0.0 for n, u in losses.items() if n != m)
            for m, v in losses.items()}


@dataclass(frozen=True)
class CellLoss:
    """A protocol cell's value over its seeds (a loss, or an accuracy): mean, sample standard deviation (None for
    one seed)."""

    mean: float
    sd: float | None

    def to_dict(self) -> dict:
        """JSON-ready fields."""
        return {"mean": self.mean, "sd": self.sd}


def mean_sd(values: list[float]) -> tuple[float, float | None]:
    """The mean and sample standard deviation of `values` (None for one value)."""
    return sum(values) / len(values), statistics.stdev(values) if len(values) > 1 else None


def as_measure(measure: Measure | str) -> Measure:
    """A Measure, or select_by's text (`heldout:loss`, a bare `loss`) read as one."""
    return measure if isinstance(measure, Measure) else Measure.parse(measure)


def cell_losses(rows: list[dict], measure: Measure | str = TARGET_LOSS) -> dict[Cell, CellLoss]:
    """Each (method, k) cell's value on `measure` (default: the target's validation loss) over the rows of its
    seeds; rows without a value on it are left out."""
    measure = as_measure(measure)
    values: dict[Cell, list[float]] = {}
    for r in rows:
        if (v := measure.value(r)) is not None:
            values.setdefault((r["method"], r["k"]), []).append(v)
    return {c: CellLoss(*mean_sd(v)) for c, v in values.items()}


def paired_interval(mean: float, sd: float | None, n: int) -> list[float] | None:
    """The 95 % Student-t interval of a mean paired difference over n seeds (None for one seed); an interval
    that excludes 0 is a difference the paired t-test finds at the 5 % level."""
    if sd is None or n < 2:
        return None
    import scipy.stats  # about 0.7 s to import; only a multi-seed summary needs it

    half = float(scipy.stats.t.ppf(0.975, n - 1)) * sd / math.sqrt(n)
    return [mean - half, mean + half]


@dataclass(frozen=True)
class PairedDifference:
    """The reference method's value minus another's at budget k, seed by seed (each seed's draws are shared by
    every method, so the pairs cancel their noise): mean, sample sd, 95 % t-interval (None for one seed), and in
    how many of the seeds the reference is lower."""

    method: str
    k: int
    mean: float
    sd: float | None
    ci95: tuple[float, float] | None
    reference_lower: int
    seeds: int

    def to_dict(self) -> dict:
        """As summary.json's kmm_minus lists it."""
        return {"method": self.method, "k": self.k, "mean": self.mean, "sd": self.sd,
                "ci95": None if self.ci95 is None else list(self.ci95), "reference_lower": self.reference_lower,
                "seeds": self.seeds}


def paired_differences(rows: list[dict], ks: list[int], reference: str = "kmm",
                       measure: Measure | str = TARGET_LOSS) -> list[PairedDifference]:
    """For every other method (and target only) at every k: the reference's value minus the method's on
    `measure`, seed by seed."""
    measure = as_measure(measure)
    by_cell: dict[Cell, dict] = {}
    for r in rows:
        if (v := measure.value(r)) is not None:
            by_cell.setdefault((r["method"], r["k"]), {})[r.get("seed")] = v
    others = [m for m in dict.fromkeys(m for m, _ in by_cell) if m != reference]
    out = []
    for m in others:
        for k in ks:
            mine, theirs = by_cell[reference, k], by_cell[m, None if m == "target_only" else k]
            d = [mine[s] - theirs[s] for s in mine if s in theirs]
            mean, sd = mean_sd(d)
            ci = paired_interval(mean, sd, len(d))
            out.append(PairedDifference(m, k, mean, sd, None if ci is None else (ci[0], ci[1]),
                                        sum(x < 0 for x in d), len(d)))
    return out


@dataclass(frozen=True)
class BestK:
    """A method's best budget on a measure: the smallest k reaching its best mean, what it bought there (the
    first seed's selection) and its value."""

    k: int
    groups: list[str]
    value: CellLoss

    def to_dict(self) -> dict:
        """JSON-ready fields."""
        return {"k": self.k, "groups": list(self.groups), "value": self.value.mean, "value_sd": self.value.sd}


@dataclass(frozen=True)
class MeasureSummary:
    """The protocol on one measure: the budgets and methods, each cell's value, each method's best k, the Borda
    count, KMM's paired differences, the target alone and the base model."""

    measure: Measure
    ks: list[int]
    methods: list[str]
    cells: dict[Cell, CellLoss]
    best_k: dict[str, BestK]
    borda: dict[str, float]
    points: dict[Cell, float]
    kmm_minus: list[PairedDifference]
    target_only: CellLoss | None
    base: float | None

    def paired(self, method: str, k: int) -> PairedDifference | None:
        """KMM minus `method` at k (None where not measured)."""
        return next((d for d in self.kmm_minus if (d.method, d.k) == (method, k)), None)

    def to_dict(self) -> dict:
        """As summary.json's evaluation.evaluations lists it."""
        return {"evaluation": self.measure.evaluation, "metric": self.measure.metric,
                "lower_is_better": self.measure.lower_is_better, "ks": list(self.ks), "methods": list(self.methods),
                "best_k": {m: b.to_dict() for m, b in self.best_k.items()}, "borda": dict(self.borda),
                "kmm_minus": [d.to_dict() for d in self.kmm_minus],
                "target_only": None if self.target_only is None else self.target_only.to_dict(), "base": self.base}


def summarise_measure(rows: list[dict], ks: list[int], measure: Measure | str = TARGET_LOSS) -> MeasureSummary:
    """Best k and the Borda count per method on `measure` (lower is better for the loss, higher for accuracy), on
    each cell's mean over its seeds, and KMM's paired differences from every other method."""
    measure = as_measure(measure)
    sign = 1.0 if measure.lower_is_better else -1.0
    methods = list(dict.fromkeys(r["method"] for r in rows if r["k"] is not None))
    cell = cell_losses(rows, measure)
    missing = sorted({f"{m} k={k}" for m in methods for k in ks if (m, k) not in cell})
    if missing:
        raise ValueError(f"no value on {measure.name} for {missing[:5]}: the fine-tunes did not measure it")
    borda = dict.fromkeys(methods, 0.0)
    points: dict[Cell, float] = {}
    for k in ks:
        for m, p in borda_points({m: sign * cell[m, k].mean for m in methods}).items():
            borda[m] += p
            points[m, k] = p
    best_k = {}
    for m in methods:
        k = min(ks, key=lambda k: (sign * cell[m, k].mean, k))  # the smallest k reaching the best value
        groups = next(r["groups"] for r in rows if (r["method"], r["k"]) == (m, k))  # the first seed's
        best_k[m] = BestK(k, list(groups), cell[m, k])
    base = next((v for r in rows if (v := measure.base(r)) is not None), None)
    paired = paired_differences(rows, ks, measure=measure) if "kmm" in methods else []
    return MeasureSummary(measure, list(ks), methods, cell, best_k, borda, points, paired,
                          cell.get(("target_only", None)), base)


def summarise(rows: list[dict], ks: list[int], measure: Measure | str = "loss") -> dict:
    """summary.json's `evaluation` on `measure` (finetune.select_by: best k, Borda, KMM's paired differences), with
    the target's validation loss beside it at each best k; every row gains its cell's `points` and `best` (the
    method's best-k cell) on the measure."""
    measure = as_measure(measure)
    main = summarise_measure(rows, ks, measure)
    loss = main.cells if measure == TARGET_LOSS else cell_losses(rows)
    legacy = measure.evaluation == TARGET_LOSS.evaluation and measure.metric != "loss"  # target_val:accuracy
    field = "val_accuracy"
    best_k = {}
    for m, b in main.best_k.items():
        val = loss.get((m, b.k))
        best_k[m] = {"k": b.k, "val_loss": None if val is None else val.mean, "val_loss_sd": None if val is None
                     else val.sd, "groups": b.groups, "evaluation": measure.evaluation, "metric": measure.metric,
                     "value": b.value.mean, "value_sd": b.value.sd}
        if legacy:
            best_k[m] |= {field: b.value.mean, f"{field}_sd": b.value.sd}
    for r in rows:
        r["points"] = main.points.get((r["method"], r["k"]))
        r["best"] = r["k"] is not None and main.best_k[r["method"]].k == r["k"]
    target = loss.get(("target_only", None))
    out = {"ks": list(ks), "methods": main.methods, "seeds": sorted({r.get("seed") for r in rows} - {None}),
           "metric": measure.metric, "evaluation": measure.evaluation, "select_by": measure.name,
           "kmm_minus": [d.to_dict() for d in main.kmm_minus], "best_k": best_k, "borda": main.borda,
           "target_only_val_loss": None if target is None else target.mean,
           "target_only_val_loss_sd": None if target is None else target.sd,
           "base_val_loss": next((r["base_val_loss"] for r in rows if r.get("base_val_loss") is not None), None),
           "target_only_value": None if main.target_only is None else main.target_only.mean,
           "target_only_value_sd": None if main.target_only is None else main.target_only.sd, "base_value": main.base}
    if legacy:
        out |= {f"target_only_{field}": out["target_only_value"], f"base_{field}": main.base}
    return out
