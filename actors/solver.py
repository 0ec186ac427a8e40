"""SolverActor: solves the KMM problem on its own worker (the driver only orchestrates)."""

from __future__ import annotations

import numpy as np
import ray

from engine.bootstrap import resample_run
from engine.kmm_solve import solve_gram, solve_vectors
from solvers import KMMSolution


@ray.remote(num_cpus=1, max_restarts=1)
class SolverActor:
    """Thin shell around solvers.solve_kmm and solvers.solve_kmm_gradients."""

    def solve(self, K: np.ndarray, beta: np.ndarray, settings: dict) -> KMMSolution:
        """Solve with settings {gamma | budget, costs, method, normalize, rank_bound}; raises on a failed solve."""
        return solve_gram(K, beta, settings)

    def bootstrap(self, examples: dict[str, np.ndarray], names: list[str], run: dict, samples: int,
                  seed: int) -> tuple[np.ndarray, np.ndarray]:
        """(W, S) of engine.bootstrap.resample_run: the previews resampled, each solved as the run was."""
        return resample_run(examples, names, run, samples, seed)

    def solve_gradients(self, G: np.ndarray, g_tar: np.ndarray, settings: dict) -> KMMSolution:
        """Solve from the vectors (K never formed) with settings {gamma | budget, costs, normalize}."""
        return solve_vectors(G, g_tar, settings)
