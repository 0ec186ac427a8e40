"""The regularisation path: KMM solutions on a gamma grid (warm-started), with the ranking at every budget."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from convalue.solvers.homotopy import affordable, deduplicated, expand, lars, path_at
from convalue.solvers.kkt import kkt_violation
from convalue.solvers.operators import GramOperator
from convalue.solvers.penalised import solve_penalised
from convalue.solvers.policy import DEFAULT_POLICY, SolverPolicy
from convalue.solvers.problem import KMMInputError, KMMProblem, check_number, make_problem


@dataclass(frozen=True)
class KMMPath:
    """w(gamma) at decreasing gammas; row t of W is the exact solution at gammas[t]."""

    gammas: np.ndarray
    W: np.ndarray
    kkt: np.ndarray
    time_s: float

    @property
    def l1(self) -> np.ndarray:
        """||w(gamma)||_1 along the path (non-decreasing as gamma decreases)."""
        return np.abs(self.W).sum(axis=1)

    @property
    def n_positive(self) -> np.ndarray:
        """Number of candidates with a positive score at each gamma."""
        return (self.W > 0).sum(axis=1)

    def ranking_at(self, t: int) -> np.ndarray:
        """Candidate indices by descending score at path point t."""
        return np.argsort(-self.W[t], kind="stable")

    def top_k(self, k: int) -> list[int]:
        """The top-k positive candidates at the largest gamma where at least k are positive (else the last point)."""
        if k <= 0:
            raise ValueError(f"k must be > 0, got {k}")
        hits = np.flatnonzero(self.n_positive >= k)
        t = int(hits[0]) if hits.size else len(self.gammas) - 1
        order = self.ranking_at(t)
        return [int(i) for i in order if self.W[t, i] > 0][:k]

    def selections(self, ks: list[int]) -> dict[int, list[int]]:
        """top_k for every k (the evaluation protocol's thresholds) from one path."""
        return {k: self.top_k(k) for k in ks}


def kmm_path(K: np.ndarray, beta: np.ndarray, *, gammas: np.ndarray | None = None, n_gammas: int = 50,
             gamma_min_ratio: float = 1e-3, normalize: str = "none", formed: bool = False,
             policy: SolverPolicy = DEFAULT_POLICY) -> KMMPath:
    """Solve the penalised KMM problem on a decreasing gamma grid, each solve warm-started by the previous.

    A rank-deficient K the homotopy can afford (convalue.solvers.homotopy) is read off one homotopy path instead; a
    point of it that does not certify is solved on its own. formed, policy: as in solve_kmm.
    """
    base = make_problem(K, beta, gamma=0.0, normalize=normalize, formed=formed, policy=policy)
    gmax = float(np.abs(base.beta).max())
    if gammas is None:
        ratio = check_number("gamma_min_ratio", gamma_min_ratio, positive=True)
        if isinstance(n_gammas, bool) or not isinstance(n_gammas, (int, np.integer)) or n_gammas < 1:
            raise KMMInputError(f"n_gammas must be a positive integer, got {n_gammas!r}")
        gammas = gmax * np.geomspace(1.0, ratio, n_gammas)
    else:  # a NaN or negative gamma would be "solved" and certified like any other
        raw = np.asarray(gammas)
        if raw.ndim != 1 or raw.size == 0:
            raise KMMInputError(f"gammas must be a non-empty 1-d sequence, got shape {raw.shape}")
        gammas = np.array([check_number(f"gammas[{i}]", g, positive=False) for i, g in enumerate(raw.tolist())])
    gammas = np.sort(gammas)[::-1]
    t0 = time.perf_counter()
    op, keep = deduplicated(GramOperator(base.K, base.beta, rank=base.rank, linalg=policy.linalg), policy)
    # duplicates get 0 (expand)
    Wd = np.zeros((len(gammas), op.n))  # over the distinct candidates
    kkts = np.zeros(len(gammas))
    on_path = None
    if affordable(op, policy):
        breakpoints, W_bp, _ = lars(op, max(float(gammas.min()), 0.0), return_path=True)
        on_path = path_at(breakpoints, W_bp, gammas)
    for t, g in enumerate(gammas):
        prob = KMMProblem(K=base.K, beta=base.beta, gamma=float(g))
        if on_path is not None:
            Wd[t] = on_path[t]
            kkts[t] = kkt_violation(prob, expand(Wd[t], keep, base.n))
            if kkts[t] <= 1e-10 * max(1.0, gmax):
                continue
        Wd[t], _ = solve_penalised(op, float(g), w0=Wd[t - 1] if t else None, policy=policy)
        kkts[t] = kkt_violation(prob, expand(Wd[t], keep, base.n))
    W = expand(Wd, keep, base.n)
    return KMMPath(gammas=gammas, W=W, kkt=kkts, time_s=time.perf_counter() - t0)
