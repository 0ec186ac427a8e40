"""The Gram and solve stages of one valuation, incremental where the run folder holds a prior valuation of a
smaller pool (engine/selection/incremental.py): only the new rows' Gram tiles or statistics are computed, the
prior's w (zeros for new rows) is checked first and else warm-starts the solve; and the state the next valuation
starts from (`valuation.npz`)."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from convalue.actors.gram import build_gram
from convalue.actors.incremental import extend_gram, new_row_stats, times_rows
from convalue.actors.sharded import KeptRows, problem_of, residuals_on_actor, solve_sharded_on_actor
from convalue.actors.solver import solve_blocks_on_actor, solve_on_actor
from convalue.engine.files.errors import StoreError
from convalue.engine.files.folder import RunFolder
from convalue.engine.selection.blocked import BlockRows, GramResult, panels_of
from convalue.engine.selection.incremental import (
    STATE_FILE,
    Reuse,
    ValuationState,
    files_of,
    gram_residual,
    reuse_of,
    split_blocks,
)
from convalue.engine.selection.solve import KMMProblemData, SolveSpec
from convalue.engine.store.artifacts import read_npy
from convalue.engine.store.summary import RunSummary
from convalue.solvers import KMMSolution
from convalue.solvers.sharded import (
    DEFAULT_SHARD_POLICY,
    Prior,
    Residuals,
    ShardPolicy,
    answer_without_shards,
    prior_answer,
)

log = logging.getLogger("convalue")


@dataclass(frozen=True, eq=False)
class PriorRun:
    """The complete run a folder holds, as the next valuation reuses it: its state and, in Gram space, its K."""

    state: ValuationState
    gram: Callable[[], np.ndarray] | None  # K read (memory-mapped where local) and verified; None: no gram.npy


def load_prior(folder: RunFolder) -> PriorRun | None:
    """The folder's complete run's valuation state (verified against summary.json's checksum), or None."""
    try:
        summary = RunSummary.read(folder)
    except (FileNotFoundError, StoreError, OSError):
        return None
    entry = (summary.artifacts or {}).get(STATE_FILE)
    if summary.status != "complete" or entry is None:
        return None
    try:
        data = folder.read_bytes(STATE_FILE)
        if hashlib.sha256(data).hexdigest() != entry["sha256"]:
            raise ValueError("its bytes are not those the run wrote")
        state = ValuationState.from_bytes(data)
    except (OSError, ValueError) as exc:
        log.warning("%s: %s; the pool is valued from scratch", folder / STATE_FILE, exc)
        return None
    if list(summary.order or []) != state.order:
        return None
    gram = (summary.artifacts or {}).get("gram.npy")

    def load_gram() -> np.ndarray:
        if folder.local is None:
            return read_npy(folder, "gram.npy", gram["sha256"])
        path, digest = folder.local / "gram.npy", hashlib.sha256()
        with open(path, "rb") as fh:  # streamed: K is read twice (here and mapped), never held twice
            for chunk in iter(lambda: fh.read(1 << 24), b""):
                digest.update(chunk)
        if digest.hexdigest() != gram["sha256"]:
            raise StoreError(f"{path}: its bytes are not those the run wrote")
        return np.load(path, mmap_mode="r", allow_pickle=False)

    return PriorRun(state, load_gram if gram is not None and state.space == "gram" else None)


@dataclass(eq=False)
class Valued:
    """One valuation's Gram statistics, solution, and the state the next one starts from."""

    gram: GramResult
    spec: SolveSpec  # gamma_ratio made absolute
    sol: KMMSolution
    state: ValuationState


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
    state = ValuationState(order=list(names), files=files, target=np.asarray(g_tar, np.float64), metric=spec.metric,
                           normalize=spec.normalize, space=spec.space, gamma=sol.gamma, w=sol.w, beta=gram.beta,
                           diag=gram.diag, norm2=gram.row_norm2, cosine=gram.cosine, residual=residuals.residual,
                           ref=None if gram.K is not None else residuals.ref,
                           u_refs=None if gram.K is not None else residuals.u_refs,
                           rows_at=None if kept is None else kept.at, rows=None if kept is None else kept.rows)
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
        state = reuse.state
        if reuse.residual_exact and state.u_refs is not None and state.u_refs.shape[1] == p:
            new, kept = reuse.new_rows, reuse.kept
            s = 1.0 / np.sqrt(gram.diag) if spec.normalize == "cosine" else np.ones(n)
            _, new_parts = split_blocks(blocks, reuse.old < 0)
            u = state.u_refs[-1]  # G~^T w of the prior; the new rows' w is 0
            residual, ref = np.empty(n), np.full(n, len(state.u_refs) - 1, dtype=np.intp)
            residual[kept], ref[kept] = state.residual[reuse.old[kept]], state.ref[reuse.old[kept]]
            residual[new] = s[new] * times_rows(new_parts, sources, u, n)[new] - s[new] * gram.beta[new]
            prior = Prior(w=reuse.w0(), residual=residual, u_refs=state.u_refs, ref=ref)
        else:
            prior = Prior(w=reuse.w0())
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

