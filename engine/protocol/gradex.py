"""GradEx baselines (paper App. "GradEx"): a log-odds linearisation at a meta-initialisation theta*, its logistic
surrogate, and the forward-selection (FS) and random-ensemble (RE) rankings built on the surrogate's estimates.

Per example z the driver computes, at theta* (the multitask fine-tune on target + all candidates), the base
log-odds f(z; theta*) (eq. gradex_logodds; `engine.features.losses.mean_token_log_odds` for a sequence) and the gradient of f projected
to PROJECTION_DIM (e.g. with convalue.engine.features.projection.make_projector): phi_z = P^T grad f(z; theta*).
Everything here then works on those arrays: no model, no Ray.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from scipy.special import expit

if TYPE_CHECKING:
    pass

#: the projection dimension of GradEx-FS and GradEx-RE (App. "Baseline hyperparameters")
PROJECTION_DIM = 100
#: GradEx-RE samples 10 N subsets (ibid.)
DRAWS_PER_CANDIDATE = 10
#: RE's subset size as a fraction of N: unstated in the paper; the DataModel's uniform rho, for a like budget
RE_RHO = 0.5
#: ridge on the surrogate's parameter (theta - theta*) as a multiple of the mean ||phi_z||^2 (unstated in the paper;
#: without it the surrogate of examples with only positive labels has no minimiser)
RIDGE = 1.0

Subset = tuple[int, ...]


def log_odds(logp: np.ndarray) -> np.ndarray:
    """Eq. gradex_logodds from log p(y|x): f = log(p / (1 - p)), stable for p near 0 and 1."""
    lp = np.minimum(np.asarray(logp, dtype=np.float64), -1e-300)
    near_one = lp > -math.log(2)
    log1m = np.empty_like(lp)
    log1m[near_one] = np.log(-np.expm1(lp[near_one]))
    log1m[~near_one] = np.log1p(-np.exp(lp[~near_one]))
    return lp - log1m


def logistic_loss(f: np.ndarray) -> np.ndarray:
    """Eq. gradex_ce_logistic: L = log(1 + exp(-f)), which is -log p(y|x) for f the log-odds of p."""
    return np.logaddexp(0.0, -np.asarray(f, dtype=np.float64))




@dataclass(frozen=True)
class LinearisedSet:
    """An example set at theta*: projected log-odds gradients phi (n x p) and base log-odds f0 (n)."""

    phi: np.ndarray
    f0: np.ndarray

    def __post_init__(self) -> None:
        phi = np.atleast_2d(np.asarray(self.phi, dtype=np.float64))
        f0 = np.asarray(self.f0, dtype=np.float64).reshape(-1)
        if phi.shape[0] != f0.shape[0]:
            raise ValueError(f"phi has {phi.shape[0]} rows but f0 {f0.shape[0]} entries")
        if not (np.all(np.isfinite(phi)) and np.all(np.isfinite(f0))):
            raise ValueError("phi and f0 must be finite")
        object.__setattr__(self, "phi", phi)
        object.__setattr__(self, "f0", f0)

    def outputs(self, v: np.ndarray) -> np.ndarray:
        """Eq. gradex_f_linearization: f0 + phi (theta - theta*), with v = theta - theta* (projected)."""
        return self.f0 + self.phi @ v


def stack(sets: Iterable[LinearisedSet]) -> LinearisedSet:
    """The union of example sets, as one set."""
    sets = list(sets)
    return LinearisedSet(np.concatenate([s.phi for s in sets]), np.concatenate([s.f0 for s in sets]))


def surrogate_loss(v: np.ndarray, train: LinearisedSet, l2: float = 0.0) -> float:
    """Eq. gradex_logistic_surrogate with the base log-odds kept: sum_z log(1 + exp(-(f0_z + phi_z^T v))), plus
    (l2 / 2) ||v||^2; at v = 0 it is the set's summed cross-entropy at theta*."""
    v = np.asarray(v, dtype=np.float64)
    return float(logistic_loss(train.outputs(v)).sum() + 0.5 * l2 * (v @ v))


def fit_surrogate(train: LinearisedSet, l2: float, *, max_iter: int = 100, tol: float = 1e-20) -> np.ndarray:
    """argmin_v of surrogate_loss (a logistic regression on features phi with offsets f0, all labels positive),
    by Newton's method with backtracking until the Newton decrement is below tol (relative to the loss); l2 > 0
    makes the minimiser exist and unique."""
    if not l2 > 0:
        raise ValueError(f"l2 must be > 0, got {l2}")
    phi = train.phi
    v = np.zeros(phi.shape[1])
    loss = surrogate_loss(v, train, l2)
    for _ in range(max_iter):
        m = train.outputs(v)
        grad = -phi.T @ expit(-m) + l2 * v
        s = expit(m) * expit(-m)
        H = phi.T @ (phi * s[:, None]) + l2 * np.eye(phi.shape[1])
        step = np.linalg.solve(H, grad)
        t, decrease = 1.0, float(grad @ step)  # the squared Newton decrement: twice the gap to the optimum, near it
        if decrease <= tol * max(1.0, abs(loss)):
            break
        while True:
            trial = surrogate_loss(v - t * step, train, l2)
            if trial <= loss - 1e-4 * t * decrease or t < 1e-12:
                break
            t *= 0.5
        v, loss = v - t * step, trial
    return v


def estimate_eval(v: np.ndarray, val: LinearisedSet) -> float:
    """Eval_hat: minus the mean linearised cross-entropy of the target's validation examples at v (higher is better)."""
    return -float(logistic_loss(val.outputs(v)).mean())


class GradEx:
    """Eval_hat(S) for subsets S of the candidates: the surrogate fit on D_tar + the examples of S, evaluated on the
    target's validation examples (cached per subset)."""

    def __init__(self, target_train: LinearisedSet, target_val: LinearisedSet,
                 candidates: Sequence[LinearisedSet], *, ridge: float = RIDGE) -> None:
        self.target_train, self.target_val, self.candidates = target_train, target_val, list(candidates)
        dims = {s.phi.shape[1] for s in [target_train, target_val, *self.candidates]}
        if len(dims) != 1:
            raise ValueError(f"every set needs the same projection dimension, got {sorted(dims)}")
        everything = stack([target_train, *self.candidates])
        #: the ridge in the features' own units, fixed once so that every subset is fitted alike
        self.l2 = ridge * max(float(np.mean(np.sum(everything.phi**2, axis=1))), 1e-300)
        self._cache: dict[Subset, float] = {}

    @property
    def n(self) -> int:
        """N: the number of candidates."""
        return len(self.candidates)

    def evaluate(self, subset: Iterable[int]) -> float:
        """Eval_hat(S): the target validation estimate after fitting the surrogate on target + S."""
        key = tuple(sorted(set(int(i) for i in subset)))
        if key not in self._cache:
            v = fit_surrogate(stack([self.target_train, *(self.candidates[i] for i in key)]), self.l2)
            self._cache[key] = estimate_eval(v, self.target_val)
        return self._cache[key]


@dataclass(frozen=True)
class ForwardSelection:
    """GradEx-FS: the candidates added in order, each one's estimated gain, Eval_hat after each step (evals[0]
    is target only), and scores: the selected M - t by their step t (all positive), the rest their last gain
    (never positive), so that Alg. 1 buys exactly FS's selection in FS's order."""

    order: tuple[int, ...]
    gains: tuple[float, ...]
    evals: tuple[float, ...]
    scores: np.ndarray


def forward_selection(gx: GradEx, *, max_size: int | None = None, tol: float = 1e-9) -> ForwardSelection:
    """GradEx-FS: from S = empty, add the candidate with the largest Eval_hat(S + {i}); stop when none improves the
    estimate by more than tol (relative to max(1, |Eval_hat|)) or |S| reaches max_size."""
    chosen: list[int] = []
    evals = [gx.evaluate(())]
    gains: list[float] = []
    last = np.zeros(gx.n)
    while len(chosen) < (gx.n if max_size is None else min(max_size, gx.n)):
        rest = [i for i in range(gx.n) if i not in chosen]
        trial = {i: gx.evaluate([*chosen, i]) - evals[-1] for i in rest}
        last[rest] = [trial[i] for i in rest]
        best = max(rest, key=lambda i: (trial[i], -i))
        if trial[best] <= tol * max(1.0, abs(evals[-1])):
            break
        chosen.append(best)
        gains.append(trial[best])
        evals.append(evals[-1] + trial[best])
    scores = np.minimum(last, 0.0)
    scores[chosen] = np.arange(len(chosen), 0, -1, dtype=np.float64)
    return ForwardSelection(tuple(chosen), tuple(gains), tuple(evals), scores)


def ensemble_subsets(n: int, *, draws: int | None = None, rho: float = RE_RHO, seed: int = 0) -> list[Subset]:
    """GradEx-RE's m subsets (default the paper's 10 N), each of round(rho N) candidates drawn uniformly."""
    if n < 1:
        raise ValueError(f"need at least one candidate, got {n}")
    if not 0.0 < rho <= 1.0:
        raise ValueError(f"rho must be in (0, 1], got {rho}")
    m = DRAWS_PER_CANDIDATE * n if draws is None else draws
    size = min(max(round(rho * n), 1), n)
    rng = np.random.default_rng([seed, 0xE5])
    return [tuple(sorted(int(i) for i in rng.choice(n, size=size, replace=False))) for _ in range(m)]


def random_ensemble(gx: GradEx, subsets: Sequence[Subset], *, centre: bool = True) -> np.ndarray:
    """Eq. gradex_re_score: w_i = the mean of Eval_hat(S_r) over the sampled S_r that contain i; with centre,
    minus Eval_hat(target only) (a shift: the same ranking, and positive where subsets with i beat target only)."""
    totals, counts = np.zeros(gx.n), np.zeros(gx.n)
    for s in subsets:
        e = gx.evaluate(s)
        for i in set(s):
            totals[i] += e
            counts[i] += 1
    if not counts.all():
        missing = np.flatnonzero(counts == 0).tolist()
        raise ValueError(f"candidates {missing[:10]} are in no sampled subset: draw more subsets")
    w = totals / counts
    return w - gx.evaluate(()) if centre else w
