"""SolveSpec: how a run solves KMM (form, solver settings, metric, space); one object for the run's solve, the
solver actor, a re-solve and the bootstrap's resamples."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from convalue.engine.selection.blocked import PANEL_ROWS, fisher_root
from convalue.engine.selection.gram import metric_vectors
from convalue.solvers import KMMSolution, solve_kmm, solve_kmm_gradients
from convalue.solvers.linalg import self_gram


@dataclass(frozen=True, eq=False)
class KMMProblemData:
    """The run's problem in its metric: beta, and K (Gram space) or the vectors (gradient space)."""

    beta: np.ndarray
    K: np.ndarray | None
    G: np.ndarray | None
    g_tar: np.ndarray | None
    M: np.ndarray | None  # the diagonal Fisher metric's weights (None: Euclidean)


def _diag(problem: KMMProblemData) -> np.ndarray:
    """diag(K) of a problem: from K, else the squared row norms of the vectors."""
    return np.diag(problem.K) if problem.K is not None else np.einsum("ij,ij->i", problem.G, problem.G)


@dataclass(frozen=True, eq=False)
class SolveSpec:
    """The form (gamma, gamma_ratio or budget), solver settings, metric and space a run solves KMM with.

    gamma_ratio: gamma as a fraction of gamma_max(beta, diag K), the smallest gamma whose scores are all zero;
    every solve turns it into the absolute gamma of its own problem (KMMSolution.gamma is that value).
    """

    gamma: float | None = None
    gamma_ratio: float | None = None
    budget: float | None = None
    method: str = "auto"
    normalize: str = "none"
    tol: float | None = None
    costs: np.ndarray | None = None
    rank_bound: int | None = None
    metric: str = "euclidean"
    space: str = "gram"

    @classmethod
    def from_config(cls, cfg: Any, *, costs: np.ndarray | None, rank_bound: int | None, space: str) -> SolveSpec:
        """The spec of a run config (cfg: RunConfig), with its prices, K's rank bound (p) and the chosen space."""
        s = cfg.solver
        return cls(gamma=s.gamma, gamma_ratio=s.gamma_ratio, budget=s.budget, method=s.method, normalize=s.normalize,
                   tol=s.tol, costs=costs, rank_bound=rank_bound, metric=cfg.features.metric, space=space)

    def replace(self, **changes: Any) -> SolveSpec:
        """A copy with some fields changed."""
        return dataclasses.replace(self, **changes)

    def problem(self, G: np.ndarray, g_tar: np.ndarray) -> KMMProblemData:
        """The problem of group vectors G and g_tar in the run's metric: K = G G^T formed only in Gram space."""
        Gm, gm, M = metric_vectors(self.metric, np.asarray(G, np.float64), np.asarray(g_tar, np.float64))
        beta = Gm @ gm
        if self.space == "gradients":
            return KMMProblemData(beta=beta, K=None, G=Gm, g_tar=gm, M=M)
        return KMMProblemData(beta=beta, K=self_gram(Gm), G=None, g_tar=None, M=M)

    def gamma_max(self, beta: np.ndarray, diag: np.ndarray | None) -> float:
        """The smallest gamma at which every score is zero: max_i |beta_i| / (c_i sqrt(K_ii)), the beta the solver
        sees (sqrt(K_ii) with `normalize: cosine` only; the prices c_i where there are any)."""
        b = np.abs(np.asarray(beta, np.float64))
        if self.normalize == "cosine":  # diag is needed only here
            d = np.sqrt(np.asarray(diag, np.float64))
            b = np.divide(b, d, out=np.zeros_like(b), where=d > 0)  # a zero row is refused by the solver itself
        if self.costs is not None:
            b = b / np.asarray(self.costs, np.float64)
        return float(b.max()) if b.size else 0.0

    def absolute_gamma(self, problem: KMMProblemData) -> float | None:
        """The gamma a solve of this problem uses: gamma, or gamma_ratio * gamma_max (None: the budget form)."""
        if self.gamma_ratio is None:
            return self.gamma
        return self._gamma(problem.beta, _diag(problem))

    def resolved(self, beta: np.ndarray, diag: np.ndarray | None) -> SolveSpec:
        """This spec with gamma_ratio turned into the absolute gamma of the problem with this beta and diag(K) (row
        norms squared, in the run's metric; used with `normalize: cosine` only): what a bootstrap or a re-solve should
        reuse. Itself without a ratio."""
        if self.gamma_ratio is None:
            return self
        return self.replace(gamma=self._gamma(beta, diag), gamma_ratio=None)

    def _gamma(self, beta: np.ndarray, diag: np.ndarray | None) -> float | None:
        return self.gamma if self.gamma_ratio is None else self.gamma_ratio * self.gamma_max(beta, diag)

    def solve(self, problem: KMMProblemData) -> KMMSolution:
        """Solve a problem in the run's space; raises on a failed solve."""
        if problem.K is not None:
            return self.solve_gram(problem.K, problem.beta)
        return self.solve_vectors(problem.G, problem.g_tar)

    def solve_gram(self, K: np.ndarray, beta: np.ndarray) -> KMMSolution:
        """solve_kmm on K and beta with these settings; K is the run's own, formed as G G^T (by the blocked Gram, a
        resample or `convalue score`), so it is validated in O(N^2), without a spectral check."""
        return solve_kmm(K, beta, gamma=self._gamma(beta, np.diag(K)), budget=self.budget, costs=self.costs,
                         method=self.method, normalize=self.normalize, rank_bound=self.rank_bound, tol=self.tol,
                         formed=True)

    def solve_vectors(self, G: np.ndarray, g_tar: np.ndarray, overwrite: bool = False) -> KMMSolution:
        """solve_kmm_gradients from vectors already in the run's metric (K formed only on active sets); overwrite:
        G (float64) may be scaled in place."""
        gamma = self.gamma
        if self.gamma_ratio is not None:
            gamma = self._gamma(G @ g_tar, np.einsum("ij,ij->i", G, G) if self.normalize == "cosine" else None)
        return solve_kmm_gradients(G, g_tar, gamma=gamma, budget=self.budget, costs=self.costs,
                                   normalize=self.normalize, tol=self.tol, overwrite_G=overwrite)

    def solve_rows(self, G: np.ndarray, g_tar: np.ndarray) -> KMMSolution:
        """solve_vectors on raw group vectors G (float64, C-ordered, the caller's to overwrite): the metric and the
        row normalisation are applied in place, so G stays the only N x p array (3.3 GB less at N = 100,000)."""
        g = np.asarray(g_tar, np.float64)
        if self.metric == "diag_fisher":
            rows = range(0, len(G), PANEL_ROWS)
            _, root = fisher_root([np.einsum("ij,ij->j", G[s:s + PANEL_ROWS], G[s:s + PANEL_ROWS]) for s in rows],
                                  len(G))
            G *= root
            g = np.divide(g, root, out=np.zeros_like(g), where=root > 0)
        return self.solve_vectors(G, g, overwrite=True)

    def scores(self, G: np.ndarray, g_tar: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(w, beta) for raw group vectors, solved as the run solves (a bootstrap resample)."""
        problem = self.problem(G, g_tar)
        return self.solve(problem).w, problem.beta
