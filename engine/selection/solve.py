"""The run's KMM solve from its settings {gamma | budget, costs, method, normalize, rank_bound, tol}: in the Gram or in
gradient space. One place for the run's solve, the solver actor, a re-solve and the bootstrap's resamples."""

from __future__ import annotations

import numpy as np

from convalue.solvers import KMMSolution, solve_kmm, solve_kmm_gradients


def solve_gram(K: np.ndarray, beta: np.ndarray, settings: dict) -> KMMSolution:
    """solve_kmm on K and beta with the run's settings; raises on a failed solve."""
    return solve_kmm(K, beta, gamma=settings.get("gamma"), budget=settings.get("budget"), costs=settings.get("costs"),
                     method=settings.get("method") or "auto", normalize=settings.get("normalize") or "none",
                     rank_bound=settings.get("rank_bound"), tol=settings.get("tol"))


def solve_vectors(G: np.ndarray, g_tar: np.ndarray, settings: dict) -> KMMSolution:
    """solve_kmm_gradients from the vectors (no Gram reduced or written) with the run's settings (the active set)."""
    return solve_kmm_gradients(G, g_tar, gamma=settings.get("gamma"), budget=settings.get("budget"),
                               costs=settings.get("costs"), normalize=settings.get("normalize") or "none",
                               tol=settings.get("tol"))
