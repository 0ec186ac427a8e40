"""The evaluation protocol over budgets (paper Sec. 5 and Alg. 1): what each method buys at every k and which
fine-tunes that takes; engine.protocol.summaries turns their results into best k, Borda and paired intervals."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from convalue.engine.config import ConfigError, FinetuneConfig
from convalue.engine.protocol.summaries import (  # the summaries were first defined here: their import path stays
    CellLoss,
    borda_points,
    cell_losses,
    mean_sd,
    paired_differences,
    paired_interval,
    summarise,
)
from convalue.engine.selection.select import select_top_k

__all__ = ["BASELINE_METHODS", "LABELS", "MIXTURES", "CellLoss", "PlannedRun", "borda_points", "cell_losses",
           "distinct_jobs", "given_weights", "label_of", "mean_sd", "method_scores", "mix_runs",
           "paired_differences", "paired_interval", "plan_runs", "summarise"]

BASELINE_METHODS = ("alignment", "cosine", "random")  # ranked like KMM, at every k
LABELS = {"kmm": "KMM", "alignment": "alignment", "cosine": "one-step cosine", "random": "random",
          "target_only": "target only"}
#: a representation's method tag as the paper names it (`one_step+kmm` is One-Step + KMM)
REPRESENTATION_LABELS = {"one_step": "One-Step", "tv": "TV", "grpo": "GRPO"}
#: finetune.mixture's values, read from the config's type so the two cannot drift apart
MIXTURES = typing.get_args(typing.get_type_hints(FinetuneConfig)["mixture"])


@dataclass(frozen=True)
class PlannedRun:
    """One (method, k) cell of the protocol: the groups it buys (sorted) and its fine-tune's label."""

    method: str
    k: int | None  # None: target only, the same at every k
    groups: tuple[str, ...]
    weights: tuple[float, ...] | None = None  # mixture weights of `groups` (None: uniform draws)
    rho: float | None = None  # rho_k of Alg. 1 (None: finetune.rho)

    def weight_map(self) -> dict[str, float] | None:
        """The mixture weights by group name (None: uniform)."""
        return None if self.weights is None else dict(zip(self.groups, self.weights))

    @property
    def label(self) -> str:
        """The name printed beside its validation loss."""
        if self.method == "target_only" or (self.method == "subset" and not self.groups):
            return label_of("target_only")
        if self.method == "subset":
            return "target + {" + ", ".join(self.groups) + "}"
        return f"target + {label_of(self.method)} top-{self.k}"


def label_of(method: str) -> str:
    """A method's name in tables and plots: LABELS, or a representation's tag as the paper names it (`tv+kmm` is
    TV + KMM); any other name as written."""
    if method in LABELS:
        return LABELS[method]
    tag, kmm, rest = method.partition("+kmm")
    if rest:
        return method
    return REPRESENTATION_LABELS.get(tag, tag) + (" + KMM" if kmm else "")


def method_scores(methods: list[str], w: np.ndarray, beta: np.ndarray, cos: np.ndarray,
                  seed: int, extra: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """Each method's score per candidate (higher is bought first): KMM's w, alignment beta, cosine, a seeded random
    order (every score positive, so random buys k at every k), or a score computed elsewhere (`extra`: another
    representation's cosine or KMM scores, a fitted baseline's)."""
    table = {"kmm": w, "alignment": beta, "cosine": cos} | (extra or {})
    scores = {}
    for m in methods:
        if m == "random":
            scores[m] = np.random.default_rng([seed, 0xC3]).permutation(len(w)) + 1.0
        elif m in table:
            scores[m] = np.asarray(table[m], dtype=np.float64)
        else:
            raise ValueError(f"unknown valuation method {m!r}; expected one of {['kmm', *BASELINE_METHODS, *table]}")
    return scores


def plan_runs(names: list[str], scores: dict[str, np.ndarray], beta: np.ndarray, ks: list[int],
              target_only: bool, rho_at: Callable[[int | None], float] | None = None,
              bought: dict[str, dict[int, list[int]]] | None = None) -> list[PlannedRun]:
    """The protocol's cells: for each method and k, the top-k groups with a strictly positive score (Alg. 1,
    lines 1-9; ties broken by beta), or for a method of `bought` the candidates it gives for k (a path's
    selection at each budget), each with its rho_k where `rho_at` gives one, plus the target-only run; KMM's
    cells come first."""
    runs = []
    methods = list(scores) + [m for m in (bought or {}) if m not in scores]
    for m in methods:
        for k in ks:
            chosen = bought[m][k] if bought and m in bought else select_top_k(scores[m], beta, k)
            groups = tuple(sorted(names[i] for i in chosen))
            # with no group bought every step is a target step, whatever rho: the target-only fine-tune
            runs.append(PlannedRun(m, k, groups, rho=rho_at(k) if rho_at and groups else None))
    if target_only:
        runs.append(PlannedRun("target_only", None, ()))
    return runs


def given_weights(given: dict[str, float], names: list[str], default: float | None = None) -> dict[str, float]:
    """Every candidate's `mixture: given` weight: the user's, or `default` for a group they do not name. Refuses a
    name that is not a candidate (a typo would otherwise show up only when its group is bought) and, without a
    `default`, a candidate left out."""
    unknown = sorted(set(given) - set(names))
    missing = [] if default is not None else sorted(set(names) - set(given))
    if unknown:
        raise ConfigError(f"names {len(unknown)} group(s) that are not candidates, e.g. {unknown[:5]} (candidates: "
                          f"{sorted(names)[:10]}{' ...' if len(names) > 10 else ''})",
                          field=f"finetune.mixture_weights.{unknown[0]}", value=given[unknown[0]])
    if missing:
        raise ConfigError(f"must give a weight to every candidate group (or set finetune.mixture_default_weight); "
                          f"{len(missing)} have none, e.g. {missing[:10]}", field="finetune.mixture_weights",
                          value=f"{len(given)} groups")
    return {n: given.get(n, default) for n in names}


def mix_runs(runs: list[PlannedRun], mixture: str, scores: dict[str, np.ndarray], names: list[str],
             sizes: dict[str, int], temperature: float = 1.0,
             given: dict[str, float] | None = None) -> list[PlannedRun]:
    """The runs with their mixture weights (paper App., auxiliary weighting): `uniform` leaves them None;
    `proportional` weighs a group by its usable examples (`sizes`); `softmax` by exp(score / temperature) over the
    bought groups, the method's own scores (random's are an order: uniform); `given` by the user's weights
    (`given`: every candidate's, as given_weights resolves them; e.g. popularity). Equal weights are uniform (None),
    so such a run is the uniform run's fine-tune."""
    if mixture not in MIXTURES:
        raise ValueError(f"unknown mixture {mixture!r}; expected one of {list(MIXTURES)}")
    index = {n: i for i, n in enumerate(names)}
    out = []
    for r in runs:
        w = None
        if len(r.groups) > 1 and mixture == "proportional":
            w = np.array([sizes[g] for g in r.groups], dtype=np.float64)
        elif len(r.groups) > 1 and mixture == "given":
            if given is None:
                raise ValueError("mixture `given` needs the weights (finetune.mixture_weights)")
            w = np.array([given[g] for g in r.groups], dtype=np.float64)
        elif len(r.groups) > 1 and mixture == "softmax" and r.method in scores and r.method != "random":
            s = np.array([scores[r.method][index[g]] for g in r.groups], dtype=np.float64) / temperature
            w = np.exp(s - s.max())
        if w is not None and w.min() < w.max():
            out.append(dataclasses.replace(r, weights=tuple(float(x) for x in w / w.sum())))
        else:
            out.append(r)
    return out


def distinct_jobs(runs: list[PlannedRun]) -> tuple[list[PlannedRun], list[int]]:
    """The fine-tunes to train (one per distinct group set, mixture and rho: the same under the same seed trains
    the same model) and, for every run, the index of the job that serves it."""
    first: dict[tuple, int] = {}
    jobs: list[PlannedRun] = []
    served_by = []
    for r in runs:
        if (r.groups, r.weights, r.rho) not in first:
            first[r.groups, r.weights, r.rho] = len(jobs)
            jobs.append(r)
        served_by.append(first[r.groups, r.weights, r.rho])
    return jobs, served_by
