"""The Gram and solve stages of one valuation, incremental where the run folder holds a prior valuation of a
smaller pool (engine/selection/incremental.py): only the new rows' Gram tiles or statistics are computed, the
prior's w (zeros for new rows) is checked first and else warm-starts the solve; and the state the next valuation
starts from (`valuation.npz`)."""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np

from convalue.actors.gram import build_gram
from convalue.actors.incremental import extend_gram, new_row_stats, times_rows
from convalue.actors.sharded import KeptRows, problem_of, residuals_on_actor, solve_sharded_on_actor
from convalue.actors.solver import solve_blocks_on_actor, solve_on_actor
from convalue.engine.driver.prior import PriorRun, Valued, prior_of, state_of
from convalue.engine.selection.blocked import BlockRows, GramResult, panels_of
from convalue.engine.selection.incremental import (
    Reuse,
    files_of,
    gram_residual,
    reuse_of,
    split_blocks,
)
from convalue.engine.selection.solve import KMMProblemData, SolveSpec
from convalue.solvers import KMMSolution
from convalue.solvers.sharded import (
    DEFAULT_SHARD_POLICY,
    Residuals,
    ShardPolicy,
    answer_without_shards,
    prior_answer,
)

log = logging.getLogger("convalue")


def value_rows(spec: SolveSpec, names: list[str], blocks: list[BlockRows], sources: dict, g_tar: np.ndarray,
               timer, suffix: str = "", *, prior: PriorRun | None = None, shard: ShardPolicy = DEFAULT_SHARD_POLICY,
               check: Callable[[GramResult], None] = lambda gram: None,
               on_stage: Callable[[str], None] = lambda name: None) -> Valued:
    """The Gram stage (`gram<suffix>`) and the solve (`solve<suffix>`) of `names`, whose vectors are `blocks`
    (arrays: sources[file], an object-store ref or actors.sharded.StoredBlock), incremental where `prior` allows.
    check(gram) runs on the Gram statistics before the solve."""
    n = len(names)
    files = files_of(blocks, n)
    reuse, why = (None, "no prior valuation") if prior is None else reuse_of(
        prior.state, names, files, g_tar, spec.metric, spec.normalize)
    with timer.stage(f"gram{suffix}"):
        if spec.space == "gram":
            if reuse is not None and prior.gram is not None:
                gram = extend_gram(prior.gram(), reuse, blocks, sources, n, g_tar)
            else:
                gram = build_gram(blocks, sources, n, g_tar, spec.metric, with_K=True)
        elif reuse is not None:
            gram = new_row_stats(reuse, blocks, sources, n, g_tar)
        else:
            gram = build_gram(blocks, sources, n, g_tar, spec.metric, with_K=False)
        check(gram)
    if reuse is None and prior is not None:
        log.info("the prior valuation is not reused: %s", why)
    spec = spec.resolved(gram.beta, gram.diag)  # gamma_ratio -> this problem's absolute gamma
    on_stage("solve")
    with timer.stage(f"solve{suffix}"):
        kept = None
        if gram.K is not None:
            sol, residuals = _solve_gram(spec, gram, reuse)
        else:
            sol, residuals, kept = _solve_gradients(spec, gram, blocks, sources, n, g_tar, shard, reuse)
    if reuse is not None:
        gram.stats.setdefault("incremental", {})["prior"] = (
            sol.info.get("sharded", {}).get("prior") if "sharded" in sol.info else
            "certified" if sol.method == "prior" else "solved")
    state = state_of(names, files, g_tar, spec, sol, gram, residuals, None if kept is None else (kept.at, kept.rows))
    return Valued(gram, spec, sol, state)


def _solve_gram(spec: SolveSpec, gram: GramResult, reuse: Reuse | None) -> tuple[KMMSolution, Residuals]:
    """K's solve: the prior's w (zeros for new rows) where it still certifies, else the solver actor's."""
    sol = None
    if reuse is not None and spec.gamma is not None and spec.metric == "euclidean":
        w0 = reuse.w0()
        s = 1.0 / np.sqrt(gram.diag) if spec.normalize == "cosine" else np.ones(len(w0))
        sol = prior_answer(w0, gram_residual(gram.K, gram.beta, w0, spec.normalize), s * gram.beta, spec.gamma,
                           costs=spec.costs, tol=spec.tol)
    if sol is None:
        sol = solve_on_actor(spec, KMMProblemData(beta=gram.beta, K=gram.K, G=None, g_tar=None, M=gram.M))
    r = gram_residual(gram.K, gram.beta, sol.w, spec.normalize)
    return sol, Residuals(residual=r, ref=np.zeros(r.size, dtype=np.intp), u_refs=np.zeros((1, 0)))


def _solve_gradients(spec: SolveSpec, gram: GramResult, blocks: list[BlockRows], sources: dict, n: int,
                     g_tar: np.ndarray, shard: ShardPolicy,
                     reuse: Reuse | None) -> tuple[KMMSolution, Residuals, KeptRows | None]:
    """G's solve: gathered on a solver actor where all of G fits the shard policy and there is no prior to start
    from; else the sharded solve, from the prior (and the rows it kept) where there is one. Either leaves its
    residuals and the rows the next valuation keeps (Euclidean only)."""
    p = int(np.shape(g_tar)[0])
    panels = panels_of(blocks)
    if reuse is None and shard.holds_all(n, p):
        sol = solve_blocks_on_actor(spec, blocks, sources, n, g_tar)
        if spec.metric != "euclidean":  # no state: the diagonal Fisher metric is never reused
            return sol, Residuals(np.zeros(n), np.zeros(n, dtype=np.intp), np.zeros((1, p))), None
        left, kept = residuals_on_actor(panels, sources, n, p, gram.beta, gram.diag, sol.w, spec.normalize,
                                        shard.keep_rows_bytes // (4 * p))
        return sol, left, kept
    prior = cache = keep_from = None
    if reuse is not None:
        _, new_parts = split_blocks(blocks, reuse.old < 0)
        prior = prior_of(reuse, gram, spec.normalize, p, lambda u: times_rows(new_parts, sources, u, n))
        cache = reuse.kept_rows()
        keep_from = np.zeros(n, dtype=bool)  # the next state keeps rows it has without loading a block
        keep_from[reuse.new_rows] = True
        if cache is not None:
            keep_from[cache[0]] = True
            cache = KeptRows(at=cache[0], rows=cache[1])
    problem = problem_of(spec, n, g_tar, gram, shard, prior, cache, keep_from)
    sol = answer_without_shards(n, p, problem.beta, problem.diag, problem.g_tar, prior=prior, gamma=problem.gamma,
                                budget=problem.budget, costs=problem.costs, normalize=problem.normalize,
                                tol=problem.tol, policy=problem.policy, shard=shard)
    stats = {"passes": 0, "blocks_loaded": 0, "panels": len(panels)}  # where the prior answers in the driver
    kept = cache
    if sol is None:
        sol, stats, kept = solve_sharded_on_actor(problem, panels, sources)
    gram.stats["sharded"] = stats | sol.info["sharded"]
    return sol, sol.info["residuals"], kept

