"""Alg. 1's rho_k chosen per budget (finetune.tune): each grid ratio's mean value over the methods that buy at k
and the tuning seeds, on a measure that is not the reported one; the best ratio is rho_k for every method."""

from __future__ import annotations

import math
from dataclasses import dataclass

from convalue.engine.protocol.measures import Measure


@dataclass(frozen=True)
class RhoTuning:
    """The tuning's outcome: by `measure`, over `grid` and `seeds`, each budget's mean value per ratio (`values[k]
    [i]` for grid[i], None where no fine-tune at k bought a group), the cells averaged, the chosen rho_k, and the
    tuning fine-tunes trained now and read back."""

    measure: Measure
    grid: tuple[float, ...]
    seeds: tuple[int, ...]
    values: dict[int, tuple[float | None, ...]]
    cells: dict[int, int]
    chosen: dict[int, float]
    trained: int = 0
    reused: int = 0

    def rho_at(self, k: int | None) -> float | None:
        """rho_k as chosen (None for a budget where no method buys: its runs are the target alone)."""
        return self.chosen.get(k)

    def to_dict(self) -> dict:
        """summary.json's evaluation.tuning."""
        return {"by": self.measure.name, "grid": list(self.grid), "seeds": list(self.seeds),
                "chosen": {str(k): r for k, r in self.chosen.items()},
                "values": {str(k): list(v) for k, v in self.values.items()},
                "cells": {str(k): n for k, n in self.cells.items()},
                "fine_tunes": {"trained": self.trained, "reused": self.reused}}


def choose_rho(rows: list[dict], ks: list[int], measure: Measure, grid: list[float],
               seeds: list[int]) -> RhoTuning:
    """rho_k for each k: the grid ratio whose mean `measure` over the rows at k (one per method that buys a group,
    and seed) is best, the first of the grid on a tie; no rho_k where no row at k bought a group. Every ratio must
    have the same cells at k (the same methods and seeds), so the means compare like with like."""
    values: dict[int, tuple[float | None, ...]] = {}
    cells: dict[int, int] = {}
    chosen: dict[int, float] = {}
    for k in ks:
        per_rho = []
        for rho in grid:
            at = [measure.value(r) for r in rows if r["k"] == k and r["groups"] and r["rho"] == rho]
            if any(v is None or not math.isfinite(v) for v in at):
                raise ValueError(f"a tuning fine-tune at k = {k}, rho = {rho} has no finite {measure.words}")
            per_rho.append(at)
        sizes = {len(at) for at in per_rho}
        if len(sizes) != 1:
            raise ValueError(f"the tuning's ratios at k = {k} have different numbers of fine-tunes {sorted(sizes)}")
        cells[k] = sizes.pop()
        means = tuple(sum(at) / len(at) if at else None for at in per_rho)
        values[k] = means
        if cells[k] == 0:  # every run at k is the target alone: no ratio to choose
            continue
        sign = 1.0 if measure.lower_is_better else -1.0
        best = min(range(len(grid)), key=lambda i: (sign * means[i], i))
        chosen[k] = grid[best]
    return RhoTuning(measure, tuple(grid), tuple(seeds), values, cells, chosen)
