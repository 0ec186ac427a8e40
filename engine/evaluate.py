"""The evaluation protocol over budgets (paper Sec. 5 and Alg. 1): what each method buys at every k, which
fine-tunes that takes, and each method's best k and Borda count over the fine-tunes' validation losses."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.select import select_top_k

BASELINE_METHODS = ("alignment", "cosine", "random")  # ranked like KMM, at every k
LABELS = {"kmm": "KMM", "alignment": "alignment", "cosine": "one-step cosine", "random": "random"}


@dataclass(frozen=True)
class PlannedRun:
    """One (method, k) cell of the protocol: the groups it buys (sorted) and its fine-tune's label."""

    method: str
    k: int | None  # None: target only, the same at every k
    groups: tuple[str, ...]

    @property
    def label(self) -> str:
        """The name printed beside its validation loss."""
        if self.method == "target_only":
            return "target only"
        return f"target + {LABELS[self.method]} top-{self.k}"


def method_scores(methods: list[str], w: np.ndarray, beta: np.ndarray, cos: np.ndarray,
                  seed: int) -> dict[str, np.ndarray]:
    """Each method's score per candidate (higher is bought first): KMM's w, alignment beta, cosine, or a seeded
    random order (every score positive, so random buys k at every k)."""
    table = {"kmm": w, "alignment": beta, "cosine": cos}
    scores = {}
    for m in methods:
        if m == "random":
            scores[m] = np.random.default_rng([seed, 0xC3]).permutation(len(w)) + 1.0
        elif m in table:
            scores[m] = np.asarray(table[m], dtype=np.float64)
        else:
            raise ValueError(f"unknown valuation method {m!r}; expected one of {['kmm', *BASELINE_METHODS]}")
    return scores


def plan_runs(names: list[str], scores: dict[str, np.ndarray], beta: np.ndarray, ks: list[int],
              target_only: bool) -> list[PlannedRun]:
    """The protocol's cells: for each method and k, the top-k groups with a strictly positive score (Alg. 1,
    lines 1-9; ties broken by beta), plus the target-only run; KMM's cells come first."""
    runs = [PlannedRun(m, k, tuple(sorted(names[i] for i in select_top_k(s, beta, k))))
            for m, s in scores.items() for k in ks]
    if target_only:
        runs.append(PlannedRun("target_only", None, ()))
    return runs


def distinct_jobs(runs: list[PlannedRun]) -> tuple[list[PlannedRun], list[int]]:
    """The fine-tunes to train (one per distinct group set: the same set under the same seed trains the same
    model) and, for every run, the index of the job that serves it."""
    first: dict[tuple[str, ...], int] = {}
    jobs: list[PlannedRun] = []
    served_by = []
    for r in runs:
        if r.groups not in first:
            first[r.groups] = len(jobs)
            jobs.append(r)
        served_by.append(first[r.groups])
    return jobs, served_by


def borda_points(losses: dict[str, float]) -> dict[str, float]:
    """Borda points at one k: one per method with a strictly higher loss, half per tie (the paper's fractional
    counts)."""
    return {m: sum(1.0 if v < u else 0.5 if v == u else 0.0 for n, u in losses.items() if n != m)
            for m, v in losses.items()}


def summarise(rows: list[dict], ks: list[int]) -> dict:
    """Best-k and Borda count per method from the per-(method, k) fine-tune rows (validation loss: lower is
    better); the rows gain their `points` at their k and `best` (the method's best-k row)."""
    methods = list(dict.fromkeys(r["method"] for r in rows if r["k"] is not None))
    cell = {(r["method"], r["k"]): r for r in rows if r["k"] is not None}
    borda = dict.fromkeys(methods, 0.0)
    for k in ks:
        points = borda_points({m: cell[m, k]["val_loss"] for m in methods})
        for m, p in points.items():
            borda[m] += p
            cell[m, k]["points"] = p
    best_k = {}
    for m in methods:
        k = min(ks, key=lambda k: (cell[m, k]["val_loss"], k))  # the smallest k reaching the lowest loss
        best_k[m] = {"k": k, "val_loss": cell[m, k]["val_loss"], "groups": cell[m, k]["groups"]}
        for kk in ks:
            cell[m, kk]["best"] = kk == k
    for r in rows:
        r.setdefault("points", None)
        r.setdefault("best", False)
    base = next((r["base_val_loss"] for r in rows if r.get("base_val_loss") is not None), None)
    target = next((r["val_loss"] for r in rows if r["method"] == "target_only"), None)
    return {"ks": list(ks), "methods": methods, "best_k": best_k, "borda": borda,
            "target_only_val_loss": target, "base_val_loss": base}
