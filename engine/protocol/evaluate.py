"""The evaluation protocol over budgets (paper Sec. 5 and Alg. 1): what each method buys at every k, which
fine-tunes that takes, and each method's best k and Borda count over the fine-tunes' validation losses (means
over seeds, with their spread, where each cell is trained under several: paper App., multi-seed results)."""

from __future__ import annotations

import dataclasses
import math
import statistics
import typing
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from convalue.engine.config import ConfigError, FinetuneConfig
from convalue.engine.selection.select import select_top_k

BASELINE_METHODS = ("alignment", "cosine", "random")  # ranked like KMM, at every k
LABELS = {"kmm": "KMM", "alignment": "alignment", "cosine": "one-step cosine", "random": "random",
          "target_only": "target only"}
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
    """A method's name in tables and plots (LABELS, or a representation's `tv`, `tv+kmm`, ... as written)."""
    return LABELS.get(method) or method.replace("+kmm", " + KMM")


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


def borda_points(losses: dict[str, float]) -> dict[str, float]:
    """Borda points at one k: one per method with a strictly higher loss, half per tie (the paper's fractional
    counts)."""
    return {m: sum(1.0 if v < u else 0.5 if v == u else 0.0 for n, u in losses.items() if n != m)
            for m, v in losses.items()}


@dataclass(frozen=True)
class CellLoss:
    """A protocol cell's validation loss over its seeds: mean, sample standard deviation (None for one seed)."""

    mean: float
    sd: float | None


def mean_sd(values: list[float]) -> tuple[float, float | None]:
    """The mean and sample standard deviation of `values` (None for one value)."""
    return sum(values) / len(values), statistics.stdev(values) if len(values) > 1 else None


#: what a protocol can be judged on: the row field, and whether lower is better
METRICS = {"loss": ("val_loss", True), "accuracy": ("val_accuracy", False)}


def cell_losses(rows: list[dict], field: str = "val_loss") -> dict[tuple[str, int | None], CellLoss]:
    """Each (method, k) cell's value of `field` (validation loss, or accuracy) over the rows of its seeds."""
    losses: dict[tuple[str, int | None], list[float]] = {}
    for r in rows:
        losses.setdefault((r["method"], r["k"]), []).append(r[field])
    return {c: CellLoss(*mean_sd(v)) for c, v in losses.items()}


def paired_differences(rows: list[dict], ks: list[int], reference: str = "kmm",
                       field: str = "val_loss") -> list[dict]:
    """For every other method (and target only) at every k: the reference's loss minus the method's, seed by seed
    (each seed's draws are shared by all methods, so the pairs cancel their noise); the mean, the sample sd and
    its 95 % t-interval (None for one seed) and in how many seeds the reference is lower."""
    by_cell: dict[tuple[str, int | None], dict] = {}
    for r in rows:
        by_cell.setdefault((r["method"], r["k"]), {})[r.get("seed")] = r[field]
    others = [m for m in dict.fromkeys(m for m, _ in by_cell) if m != reference]
    out = []
    for m in others:
        for k in ks:
            mine, theirs = by_cell[reference, k], by_cell[m, None if m == "target_only" else k]
            d = [mine[s] - theirs[s] for s in mine]
            mean, sd = mean_sd(d)
            out.append({"method": m, "k": k, "mean": mean, "sd": sd, "ci95": paired_interval(mean, sd, len(d)),
                        "reference_lower": sum(x < 0 for x in d), "seeds": len(d)})
    return out


def paired_interval(mean: float, sd: float | None, n: int) -> list[float] | None:
    """The 95 % Student-t interval of a mean paired difference over n seeds (None for one seed); an interval
    that excludes 0 is a difference the paired t-test finds at the 5 % level."""
    if sd is None or n < 2:
        return None
    import scipy.stats  # about 0.7 s to import; only a multi-seed summary needs it

    half = float(scipy.stats.t.ppf(0.975, n - 1)) * sd / math.sqrt(n)
    return [mean - half, mean + half]


def summarise(rows: list[dict], ks: list[int], metric: str = "loss") -> dict:
    """Best-k and Borda count per method from the fine-tune rows on `metric` (validation loss: lower is better;
    accuracy: higher is better), on each cell's mean over its seeds; every row gains its cell's `points` and
    `best` (the method's best-k cell). The loss's own fields (val_loss, target_only_val_loss) are always there."""
    field, lower = METRICS[metric]
    sign = 1.0 if lower else -1.0
    methods = list(dict.fromkeys(r["method"] for r in rows if r["k"] is not None))
    cell = cell_losses(rows, field)
    loss = cell_losses(rows) if field != "val_loss" else cell
    borda = dict.fromkeys(methods, 0.0)
    points = {}
    for k in ks:
        for m, p in borda_points({m: sign * cell[m, k].mean for m in methods}).items():
            borda[m] += p
            points[m, k] = p
    best_k = {}
    for m in methods:
        k = min(ks, key=lambda k: (sign * cell[m, k].mean, k))  # the smallest k reaching the best value
        groups = next(r["groups"] for r in rows if (r["method"], r["k"]) == (m, k))  # the first seed's (random: per seed)
        best_k[m] = {"k": k, "val_loss": loss[m, k].mean, "val_loss_sd": loss[m, k].sd, "groups": groups}
        if field != "val_loss":
            best_k[m] |= {field: cell[m, k].mean, f"{field}_sd": cell[m, k].sd}
    for r in rows:
        r["points"] = points.get((r["method"], r["k"]))
        r["best"] = r["k"] is not None and best_k[r["method"]]["k"] == r["k"]
    base = next((r["base_val_loss"] for r in rows if r.get("base_val_loss") is not None), None)
    target = loss.get(("target_only", None))
    paired = paired_differences(rows, ks, field=field) if "kmm" in methods else []
    out = {"ks": list(ks), "methods": methods, "seeds": sorted({r.get("seed") for r in rows} - {None}),
           "metric": metric, "kmm_minus": paired, "best_k": best_k, "borda": borda,
           "target_only_val_loss": None if target is None else target.mean,
           "target_only_val_loss_sd": None if target is None else target.sd, "base_val_loss": base}
    if field != "val_loss":
        mine = cell.get(("target_only", None))
        out |= {f"target_only_{field}": None if mine is None else mine.mean,
                f"base_{field}": next((r.get(f"base_{field}") for r in rows if r.get(f"base_{field}") is not None),
                                      None)}
    return out
