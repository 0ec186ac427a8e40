"""SolverActor: solves the KMM problem on its own worker (the driver only orchestrates)."""

from __future__ import annotations

import numpy as np
import ray

from engine.bootstrap import kmm_scores, resample
from solvers import KMMSolution, solve_kmm, solve_kmm_gradients


@ray.remote(num_cpus=1, max_restarts=1)
class SolverActor:
    """Thin shell around solvers.solve_kmm and solvers.solve_kmm_gradients."""

    def solve(self, K: np.ndarray, beta: np.ndarray, settings: dict) -> KMMSolution:
        """Solve with settings {gamma | budget, costs, method, normalize, rank_bound}; raises on a failed solve."""
        return solve_kmm(K, beta, gamma=settings.get("gamma"), budget=settings.get("budget"),
                         costs=settings.get("costs"), method=settings.get("method", "auto"),
                         normalize=settings.get("normalize", "none"), rank_bound=settings.get("rank_bound"))

    def bootstrap(self, examples: list[np.ndarray], target: np.ndarray, run: dict, samples: int,
                  seed: int) -> tuple[np.ndarray, np.ndarray]:
        """(W, S) of engine.bootstrap.resample, each resample solved as the run was: run = {metric, space,
        settings, k}."""
        def solve(G: np.ndarray, g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            return kmm_scores(G, g, run["metric"], run["space"], run["settings"])

        return resample(examples, target, samples, seed, run["k"], solve)

    def solve_gradients(self, G: np.ndarray, g_tar: np.ndarray, settings: dict) -> KMMSolution:
        """Solve from the vectors (K never formed) with settings {gamma | budget, costs, normalize}."""
        return solve_kmm_gradients(G, g_tar, gamma=settings.get("gamma"), budget=settings.get("budget"),
                                   costs=settings.get("costs"), normalize=settings.get("normalize", "none"))
