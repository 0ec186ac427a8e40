"""Learning curves (finetune.eval_every): each protocol cell's loss against steps on each evaluation, the mean over
its seeds, and the step where it is lowest: where more steps stop helping."""

from __future__ import annotations

from dataclasses import asdict, dataclass


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
    def best_step(self) -> int:
        """The step of the lowest mean loss (the first on a tie)."""
        return self.steps[self.mean.index(min(self.mean))]

    def to_dict(self) -> dict:
        """summary.json's evaluation.curves entry."""
        return asdict(self) | {"best_step": self.best_step, "best": min(self.mean)}


def cell_curves(rows: list[dict], evaluations: list[str]) -> list[CellCurve]:
    """Every cell's mean curve over its seeds on each of `evaluations`, at the steps all its seeds measured (an
    additive run's seeds end at different steps: their own ends are left out of the mean); rows without a curve
    add nothing."""
    cells: dict[tuple[str, int | None], list[dict[int, dict[str, float]]]] = {}
    for r in rows:
        if r.get("curve"):
            points = {int(p["step"]): p["losses"] for p in r["curve"]}
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
