"""SolverActor: solves the KMM problem on its own worker (the driver only orchestrates)."""

from __future__ import annotations

import numpy as np
import ray

from solvers import KMMSolution, solve_kmm


@ray.remote(num_cpus=1, max_restarts=1)
class SolverActor:
    """Thin shell around solvers.solve_kmm."""

    def solve(self, K: np.ndarray, beta: np.ndarray, settings: dict) -> KMMSolution:
        """Solve with settings {gamma | budget, costs, method, normalize}; raises on a failed solve."""
        return solve_kmm(K, beta, gamma=settings.get("gamma"), budget=settings.get("budget"),
                         costs=settings.get("costs"), method=settings.get("method", "auto"),
                         normalize=settings.get("normalize", "none"))
