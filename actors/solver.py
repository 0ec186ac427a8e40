"""SolverActor: solves the KMM problem on its own worker (the driver only orchestrates)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import ray

from convalue.actors.dispatch import windowed
from convalue.engine.selection.bootstrap import resample_run, split_resamples
from convalue.engine.selection.solve import solve_gram, solve_vectors
from convalue.solvers import KMMSolution


@ray.remote(num_cpus=1, max_restarts=1)
class SolverActor:
    """Thin shell around convalue.solvers.solve_kmm and convalue.solvers.solve_kmm_gradients."""

    def solve(self, K: np.ndarray, beta: np.ndarray, settings: dict) -> KMMSolution:
        """Solve with settings {gamma | budget, costs, method, normalize, rank_bound}; raises on a failed solve."""
        return solve_gram(K, beta, settings)

    def bootstrap(self, examples: dict[str, np.ndarray], names: list[str], run: dict, samples: int,
                  seed: int, first: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """(W, S) of convalue.engine.selection.bootstrap.resample_run for resamples first .. first + samples - 1: the previews
        resampled, each solved as the run was."""
        return resample_run(examples, names, run, samples, seed, first)

    def solve_gradients(self, G: np.ndarray, g_tar: np.ndarray, settings: dict) -> KMMSolution:
        """Solve from the vectors (no Gram reduced or written) with settings {gamma | budget, costs, normalize}."""
        return solve_vectors(G, g_tar, settings)


def bootstrap_on_actors(examples: dict[str, np.ndarray], names: list[str], run: dict, samples: int, seed: int,
                        workers: int, cpus: int = 1,
                        on_part: Callable[[int], None] = lambda count: None) -> tuple[np.ndarray, np.ndarray]:
    """(W, S) of resample_run's `samples` resamples, spread over `workers` solver actors (`cpus` each) in
    contiguous parts (on_part(count) as each part arrives); equal to resample_run in one process, since each
    resample has its own seed."""
    ref = ray.put(examples)  # once in the object store, read by every actor
    parts = split_resamples(samples, 4 * workers)  # several per actor: progress, and a balanced tail
    actors = [SolverActor.options(num_cpus=cpus).remote() for _ in range(min(workers, len(parts)))]
    W, S = np.empty((samples, len(names))), np.empty((samples, len(names)), dtype=bool)
    try:
        for (first, count), (Wp, Sp) in windowed(
                actors, parts, lambda a, part: a.bootstrap.remote(ref, names, run, part[1], seed, part[0]),
                2 * len(actors)):
            W[first:first + count], S[first:first + count] = Wp, Sp
            on_part(count)
    finally:
        for a in actors:
            ray.kill(a)
    return W, S
