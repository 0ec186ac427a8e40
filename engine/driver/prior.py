"""A prior valuation as the next one reuses it (Ray-free): the run folder's stored state, the warm start it gives a
grown pool, and the grown pool valued in the driver alone where the prior still certifies it (the new rows'
statistics and residuals from their blocks, read here; no cluster is started, no old row is read)."""

from __future__ import annotations

import hashlib
import logging
import socket
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from convalue.engine.data.prepare import TARGET_KEY
from convalue.engine.files.errors import StoreError
from convalue.engine.files.folder import RunFolder
from convalue.engine.selection.blocked import (
    BlockRows,
    GramResult,
    assemble,
    panels_of,
    rows_of_blocks,
    rows_times,
    stack_rows,
    tile,
)
from convalue.engine.selection.incremental import (
    STATE_FILE,
    Reuse,
    ValuationState,
    carry_prior,
    reuse_of,
    split_blocks,
)
from convalue.engine.selection.solve import SolveSpec
from convalue.engine.store.artifacts import read_npy
from convalue.engine.store.summary import RunSummary
from convalue.engine.store.vectors import BlockMeta, VectorStore, block_vectors
from convalue.solvers import KMMSolution
from convalue.solvers.sharded import (
    DEFAULT_SHARD_POLICY,
    Prior,
    Residuals,
    ShardPolicy,
    answer_without_shards,
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


def state_of(names: list[str], files: list[str], g_tar: np.ndarray, spec: SolveSpec, sol: KMMSolution,
             gram: GramResult, residuals: Residuals, kept: tuple[np.ndarray, np.ndarray] | None) -> ValuationState:
    """The state the next valuation of a grown pool starts from (kept: the rows it keeps, (positions, rows))."""
    on_gram = gram.K is not None
    return ValuationState(order=list(names), files=files, target=np.asarray(g_tar, np.float64), metric=spec.metric,
                          normalize=spec.normalize, space=spec.space, gamma=sol.gamma, w=sol.w, beta=gram.beta,
                          diag=gram.diag, norm2=gram.row_norm2, cosine=gram.cosine, residual=residuals.residual,
                          ref=None if on_gram else residuals.ref, u_refs=None if on_gram else residuals.u_refs,
                          rows_at=None if kept is None else kept[0], rows=None if kept is None else kept[1])


def prior_of(reuse: Reuse, gram: GramResult, normalize: str, p: int,
             new_times: Callable[[np.ndarray], np.ndarray]) -> Prior:
    """The warm start of the grown pool's gradient-space solve: the prior's w (zeros for new rows) and, where the
    prior's residual still holds, every row's residual (the new rows' from new_times(u) = G u on them)."""
    state = reuse.state
    if not (reuse.residual_exact and state.u_refs is not None and state.u_refs.shape[1] == p):
        return Prior(w=reuse.w0())
    n, new, kept = reuse.old.size, reuse.new_rows, reuse.kept
    s = 1.0 / np.sqrt(gram.diag) if normalize == "cosine" else np.ones(n)
    residual, ref = np.empty(n), np.full(n, len(state.u_refs) - 1, dtype=np.intp)
    residual[kept], ref[kept] = state.residual[reuse.old[kept]], state.ref[reuse.old[kept]]
    if new.size:
        residual[new] = s[new] * new_times(state.u_refs[-1])[new] - s[new] * gram.beta[new]  # u: G~^T w of the prior
    return Prior(w=reuse.w0(), residual=residual, u_refs=state.u_refs, ref=ref)


def stored_rows(store: VectorStore, names: list[str]) -> dict[str, tuple[BlockMeta, int]]:
    """Each of the target's and `names`' stored rows: (its block, its row), from the manifest alone; a StoreError
    naming the groups that have none."""
    keys = store.done()
    where: dict[str, tuple[BlockMeta, int]] = {}
    for meta in store.blocks.values():
        for r, (g, k) in enumerate(zip(meta.groups, meta.keys)):
            if keys.get(g) == k:
                where.setdefault(g, (meta, r))
    if missing := [n for n in [TARGET_KEY, *names] if n not in where]:
        raise StoreError(f"{store.folder}: no stored vector for {missing[:5]} (blocks set aside: "
                         f"{store.dropped[:5]}); import the vectors again with --overwrite")
    return where


def value_in_driver(spec: SolveSpec, names: list[str], store: VectorStore, prior: PriorRun, timer,
                    shard: ShardPolicy = DEFAULT_SHARD_POLICY,
                    check: Callable[[GramResult], None] = lambda gram: None) -> Valued | None:
    """The gradient-space valuation of `names` where the prior valuation, with zeros for the new rows, still
    certifies it, computed in this process from the new rows' blocks alone (at most shard.max_gather_bytes of them).
    None where it does not apply or does not certify, or a block is missing or fails its checksum: the caller
    values the pool on the cluster (which sets such a block aside and says so)."""
    state = prior.state
    if spec.space != "gradients" or spec.metric != "euclidean" or (spec.gamma is None and spec.gamma_ratio is None):
        return None  # the budget form's prior always needs products over G
    if state.u_refs is None or state.u_refs.shape[1] != state.target.size:
        return None  # no residual to certify from (a Gram-space prior): nothing here can answer
    with timer.stage("load"):
        try:
            loaded = _new_rows(store, names, prior, spec, shard)
        except (StoreError, OSError):  # the cluster's load sets a bad block aside and says so
            return None
        if loaded is None:
            return None
    reuse, new_parts, arrays, g_tar = loaded.reuse, loaded.parts, loaded.arrays, loaded.g_tar
    n, p = len(names), int(g_tar.size)
    with timer.stage("gram"):
        panels = panels_of(new_parts)
        tiles = [tile(i, i, stack_rows([arrays[b.file] for b in pn.blocks], pn.blocks), None, g_tar, None,
                      with_K=False) for i, pn in enumerate(panels)]
        gram = carry_prior(assemble(n, panels, tiles, g_tar, with_K=False), reuse, on_cluster=False)
        gram.stats["tiles_per_node"] = {"driver": len(tiles)}
        gram.stats["nodes"] = {"driver": {"host": socket.gethostname(), "driver": True}}
        check(gram)
    spec = spec.resolved(gram.beta, gram.diag)
    with timer.stage("solve"):
        def new_times(u: np.ndarray) -> np.ndarray:
            out = np.full(n, np.nan)
            for b in new_parts:
                out[list(b.positions)] = rows_times(arrays[b.file], np.asarray(b.rows), u)
            return out

        start = prior_of(reuse, gram, spec.normalize, p, new_times)
        sol = answer_without_shards(n, p, gram.beta, gram.diag, g_tar, prior=start, gamma=spec.gamma,
                                    budget=spec.budget, costs=spec.costs, normalize=spec.normalize, tol=spec.tol,
                                    shard=shard)
    if sol is None:
        return None
    gram.stats["incremental"]["prior"] = sol.info["sharded"].get("prior")
    gram.stats["sharded"] = {"passes": 0, "blocks_loaded": 0, "panels": len(panels)} | sol.info["sharded"]
    state = state_of(names, loaded.files, g_tar, spec, sol, gram, sol.info["residuals"], reuse.kept_rows())
    return Valued(gram, spec, sol, state)


@dataclass(frozen=True, eq=False)
class NewRows:
    """A grown pool's new rows as read in the driver: how the pool reuses the prior, each row's block file, the new
    rows' BlockRows and their blocks' arrays, and the target vector."""

    reuse: Reuse
    files: list[str]
    parts: list[BlockRows]
    arrays: dict[str, np.ndarray]
    g_tar: np.ndarray


def _new_rows(store: VectorStore, names: list[str], prior: PriorRun, spec: SolveSpec,
              shard: ShardPolicy) -> NewRows | None:
    """The new rows of `names` read from their blocks, or None where the prior's residual does not hold or the new
    rows' blocks exceed shard.max_gather_bytes."""
    where = stored_rows(store, names)
    target_meta, target_row = where[TARGET_KEY]
    g_tar = np.asarray(block_vectors(store.folder, target_meta)[target_row], np.float64)
    files = [where[n][0].file for n in names]
    reuse, _ = reuse_of(prior.state, names, files, g_tar, spec.metric, spec.normalize)
    if reuse is None or not reuse.residual_exact:
        return None
    metas = {m.file: m for m, _ in where.values()}
    blocks = rows_of_blocks(names, {n: (m.file, r) for n, (m, r) in where.items()},
                            {f: (None, m.size) for f, m in metas.items()})
    _, new_parts = split_blocks(blocks, reuse.old < 0)
    fresh = {b.file for b in new_parts}
    if sum(metas[f].size for f in fresh) > shard.max_gather_bytes:
        return None
    return NewRows(reuse, files, new_parts, {f: block_vectors(store.folder, metas[f]) for f in fresh}, g_tar)
