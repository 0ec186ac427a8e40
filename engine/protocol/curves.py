"""Learning curves (finetune.eval_every): each protocol cell's loss against steps on each evaluation, the mean over
its seeds, and the step where it is lowest: where more steps stop helping."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from convalue.engine.protocol.evaluate import label_of
from convalue.engine.store.finetunes import curve_is_valid


def cell_label(method: str, k: int | None) -> str:
    """A cell as tables and plots name it: `KMM k=3`, `target only`."""
    return label_of(method) + (f" k={k}" if k is not None else "")


@dataclass(frozen=True)
class CellCurve:
    """One cell's (method, k; k None for the target alone) mean loss on `evaluation` at each step every seed
    measured."""

    method: str
    k: int | None
    evaluation: str
    steps: list[int]
    mean: list[float]
    seeds: int

    @property
    def label(self) -> str:
        """The cell's name in tables and plots."""
        return cell_label(self.method, self.k)

    @property
    def best_step(self) -> int | None:
        """The step of the lowest finite mean loss (the first on a tie; None where none is finite)."""
        finite = [(v, s) for s, v in zip(self.steps, self.mean) if math.isfinite(v)]
        return min(finite, key=lambda vs: vs[0])[1] if finite else None

    @property
    def best(self) -> float | None:
        """The lowest finite mean loss."""
        step = self.best_step
        return None if step is None else self.mean[self.steps.index(step)]

    def to_dict(self) -> dict:
        """summary.json's evaluation.curves entry."""
        return asdict(self) | {"best_step": self.best_step, "best": self.best}

    @classmethod
    def from_dict(cls, d: Any) -> CellCurve | None:
        """An evaluation.curves entry as written by to_dict, or None where it is not one (a damaged summary)."""
        if not isinstance(d, dict):
            return None
        steps, mean, k = d.get("steps"), d.get("mean"), d.get("k")
        if not (isinstance(d.get("method"), str) and isinstance(d.get("evaluation"), str)
                and isinstance(steps, list) and isinstance(mean, list) and steps and len(steps) == len(mean)
                and all(isinstance(s, int) for s in steps) and all(isinstance(v, (int, float)) for v in mean)
                and (k is None or isinstance(k, int)) and isinstance(d.get("seeds"), int)):
            return None
        return cls(d["method"], k, d["evaluation"], steps, [float(v) for v in mean], d["seeds"])


def cell_curves(rows: list[dict], evaluations: list[str]) -> list[CellCurve]:
    """Every cell's mean curve over its seeds on each of `evaluations`, at the steps all its seeds measured (an
    additive run's seeds end at different steps: a seed's end enters the mean only where every other seed measured
    that step too); rows without a well-formed curve add nothing."""
    cells: dict[tuple[str, int | None], list[dict[int, dict[str, float]]]] = {}
    for r in rows:
        if r.get("curve") and curve_is_valid(r["curve"]):
            points = {p["step"]: p["losses"] for p in r["curve"]}
            cells.setdefault((r["method"], r.get("k")), []).append(points)
    out = []
    for evaluation in evaluations:
        for (method, k), seeds in cells.items():
            steps = sorted(set.intersection(*(
                {s for s, losses in points.items() if losses.get(evaluation) is not None} for points in seeds)))
            if steps:
                mean = [sum(points[s][evaluation] for points in seeds) / len(seeds) for s in steps]
                out.append(CellCurve(method, k, evaluation, steps, mean, len(seeds)))
    return out
