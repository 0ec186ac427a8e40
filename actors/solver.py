"""SolverActor: solves the KMM problem on its own worker (the driver only orchestrates)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from convalue.actors.evaluation import EvaluationRequest, FinetuneOutcome, run_protocol, run_subsets
from convalue.actors.pool import ActorPool
from convalue.engine.selection.blocked import Panel, gather_float64, panels_of
from convalue.engine.selection.bootstrap import resample_run, split_resamples
from convalue.engine.selection.solve import KMMProblemData, SolveSpec
from convalue.solvers import KMMPath, KMMSolution, kmm_path

log = logging.getLogger("convalue")


@ray.remote(num_cpus=1, max_restarts=1)
class SolverActor:
    """Thin shell around SolveSpec.solve and the bootstrap's resamples."""

    def solve(self, spec: SolveSpec, problem: KMMProblemData) -> KMMSolution:
        """Solve the run's problem as spec says; raises on a failed solve."""
        return spec.solve(problem)

    def solve_blocks(self, spec: SolveSpec, n: int, panels: list[Panel], g_tar: np.ndarray,
                     *arrays: np.ndarray) -> KMMSolution:
        """Solve from the stored blocks' raw group vectors as spec says: G gathered here in float64, the metric and
        normalisation applied in place."""
        return spec.solve_rows(gather_float64(n, panels, list(arrays)), g_tar)

    def path(self, K: np.ndarray, beta: np.ndarray, normalize: str, points: int) -> KMMPath:
        """The regularisation path on K (formed as G G^T by the run: no spectral check)."""
        return kmm_path(K, beta, n_gammas=points, normalize=normalize, formed=True)

    def evaluate(self, request: EvaluationRequest, progress: object) -> FinetuneOutcome:
        """Dispatch the evaluation protocol's fine-tunes and await them; the outcome so far is kept for
        `so_far()` when one fails."""
        self.outcome = FinetuneOutcome()
        return run_protocol(request, progress, self.outcome)

    def subsets(self, request: EvaluationRequest, progress: object, subsets: list[tuple[str, ...]],
                stage: str) -> tuple[dict, float, float | None]:
        """Fine-tune target + S for every subset S (and the target alone) and return their validation losses."""
        self.outcome = FinetuneOutcome()
        return run_subsets(request, subsets, progress, self.outcome, stage)

    def so_far(self) -> FinetuneOutcome:
        """What the last evaluate() or subsets() had done (for a failed run's summary): its finished fine-tunes
        and, once tuned, rho_k."""
        return getattr(self, "outcome", None) or FinetuneOutcome()

    def bootstrap(self, examples: dict[str, np.ndarray], names: list[str], spec: SolveSpec, k: int, samples: int,
                  seed: int, first: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """(W, S) of resample_run for resamples first .. first + samples - 1: the previews resampled, each solved
        as the run was."""
        return resample_run(examples, names, spec, k, samples, seed, first)


def solve_on_actor(spec: SolveSpec, problem: KMMProblemData) -> KMMSolution:
    """spec.solve(problem) on a SolverActor of its own."""
    with ActorPool(SolverActor, 1) as pool:
        return ray.get(pool.actors[0].solve.remote(spec, ray.put(problem)))


def solve_blocks_on_actor(spec: SolveSpec, blocks: list, refs: dict, n: int, g_tar: np.ndarray) -> KMMSolution:
    """The gradient-space solve: the stored blocks gathered into G (float64) on a SolverActor and solved there (the
    driver never holds G)."""
    panels = panels_of(blocks)
    with ActorPool(SolverActor, 1) as pool:
        return ray.get(pool.actors[0].solve_blocks.remote(spec, n, panels, g_tar,
                                                          *[refs[b.file] for p in panels for b in p.blocks]))


def path_on_actor(K: np.ndarray, beta: np.ndarray, normalize: str, points: int) -> KMMPath:
    """kmm_path on a SolverActor of its own."""
    with ActorPool(SolverActor, 1) as pool:
        return ray.get(pool.actors[0].path.remote(ray.put(K), beta, normalize, points))


def _dispatch(method: str, request: EvaluationRequest, progress: Any, outcome: FinetuneOutcome,
              stages: tuple[str, ...], *args: Any) -> Any:
    """Call a SolverActor's fine-tune dispatch `method` and await it, logging how far it got (its own log lines
    stay on its node): on the driver's node (a local run folder is there), holding no CPU while its jobs hold
    theirs. On a failure `outcome` gets the fine-tunes done so far and rho_k where it was tuned."""
    here = ray.get_runtime_context().get_node_id()
    near = NodeAffinitySchedulingStrategy(here, soft=True)
    # two threads: `so_far()` is answered while the dispatch still awaits its jobs (a stopped run then ends in
    # seconds, its actor killed with the jobs it owns, instead of after every running fine-tune)
    options = {"num_cpus": 0, "scheduling_strategy": near, "max_concurrency": 2}
    with ActorPool(SolverActor, 1, options=options) as pool:
        actor = pool.actors[0]
        try:
            ref, seen = getattr(actor, method).remote(request, progress.actor, *args), {}
            while not ray.wait([ref], timeout=2.0)[0]:
                for line in progress_news(stages, progress.follow, seen):
                    log.info("%s", line)
            return ray.get(ref)
        except BaseException:
            try:
                done = ray.get(actor.so_far.remote(), timeout=10)
                outcome.finished, outcome.tuning = done.finished, done.tuning
            except Exception:  # the actor is gone too: nothing more to say
                pass
            raise


def progress_news(stages: tuple[str, ...],
                  follow: Callable[[tuple[str, ...]], dict[str, tuple[int | None, int | None]]],
                  seen: dict[str, tuple]) -> list[str]:
    """The log lines of the stages' (done, total) that changed since `seen` (updated): the first sight of a stage
    says how many fine-tunes it dispatches, later ones how far it got. rho_k's tuning ("tune") comes before the
    reported fine-tunes ("finetune"), each its own stage."""
    lines = []
    for stage, now in follow(stages).items():
        if now != seen.get(stage) and now[1] is not None:
            lines.append(f"{now[1]} fine-tunes ({stage}), {now[0]} stored; dispatched by the solver actor"
                         if stage not in seen else f"fine-tunes ({stage}): {now[0]} of {now[1]} done")
            seen[stage] = now
    return lines


def evaluate_on_actor(request: EvaluationRequest, progress: Any, outcome: FinetuneOutcome) -> FinetuneOutcome:
    """The solver actor dispatches the protocol's fine-tunes and reports their results; this driver starts it and
    awaits. `outcome` gets the rows, or on a failure the fine-tunes finished so far (and rho_k, once tuned)."""
    done = _dispatch("evaluate", request, progress, outcome, ("tune", "finetune"))
    outcome.rows, outcome.evaluation, outcome.finished, outcome.tuning = (done.rows, done.evaluation, done.finished,
                                                                         done.tuning)
    return outcome


def subsets_on_actor(request: EvaluationRequest, subsets: list[tuple[str, ...]], progress: Any,
                     outcome: FinetuneOutcome, stage: str) -> tuple[dict, float, float | None]:
    """actors.evaluation.run_subsets on a solver actor: ({S: validation loss of target + S}, target-only loss,
    base loss)."""
    return _dispatch("subsets", request, progress, outcome, (stage,), subsets, stage)


def bootstrap_on_actors(examples: dict[str, np.ndarray], names: list[str], spec: SolveSpec, k: int, samples: int,
                        seed: int, workers: int, cpus: int = 1,
                        on_part: Callable[[int], None] = lambda count: None) -> tuple[np.ndarray, np.ndarray]:
    """(W, S) of resample_run's `samples` resamples, spread over `workers` solver actors (`cpus` each) in
    contiguous parts (on_part(count) as each part arrives); equal to resample_run in one process, since each
    resample has its own seed."""
    ref = ray.put(examples)  # once in the object store, read by every actor
    parts = split_resamples(samples, 4 * workers)  # several per actor: progress, and a balanced tail
    W, S = np.empty((samples, len(names))), np.empty((samples, len(names)), dtype=bool)
    with ActorPool(SolverActor, min(workers, len(parts)), options={"num_cpus": cpus}) as pool:
        for (first, count), (Wp, Sp) in pool.map(
                parts, lambda a, part: a.bootstrap.remote(ref, names, spec, k, part[1], seed, part[0]), 2):
            W[first:first + count], S[first:first + count] = Wp, Sp
            on_part(count)
    return W, S
