"""The sharded gradient-space solve on Ray: G stays in its blocks (Ray's object store, or the run's store until a
product first needs a block), products over each panel run as tasks on the node holding most of its bytes, and a
solver actor of its own drives convalue.solvers.sharded, holding only its working set's rows."""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass

import numpy as np
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from convalue.actors.gram import load_block, near
from convalue.engine.files.folder import RunFolder
from convalue.engine.selection.blocked import GramResult, Panel, rows_times
from convalue.engine.selection.solve import SolveSpec
from convalue.engine.store.vectors import MANIFEST, BlockMeta
from convalue.solvers import DEFAULT_POLICY, KMMSolution, SolverPolicy
from convalue.solvers.sharded import (
    Prior,
    Residuals,
    ShardedGradients,
    ShardPolicy,
    rows_to_keep,
    solve_sharded,
)


def _node() -> str:
    return ray.get_runtime_context().get_node_id()


def _moved(panel: Panel, node: str) -> int:
    """Block bytes a task on `node` reads from other nodes."""
    return sum(b.nbytes for b in panel.blocks if b.node is not None and b.node != node)


@ray.remote(num_cpus=1)
def panel_times(panel: Panel, u: np.ndarray, *arrays: np.ndarray) -> tuple[np.ndarray, str, int]:
    """(X u in float64 for the panel's rows, in panel order; the node; block bytes read from other nodes), a chunk
    of float32 rows cast at a time (no float64 copy of the panel)."""
    out = [rows_times(a, np.asarray(b.rows), u) for a, b in zip(arrays, panel.blocks)]
    node = _node()
    return np.concatenate(out), node, _moved(panel, node)


@ray.remote(num_cpus=1)
def panel_rows(panel: Panel, wanted: np.ndarray, *arrays: np.ndarray) -> tuple[np.ndarray, np.ndarray, str, int]:
    """(positions, their raw float32 rows, the node, bytes read from other nodes) of the run positions `wanted`
    (sorted) that this panel holds."""
    pos, rows = [], []
    for a, b in zip(arrays, panel.blocks):
        positions = np.asarray(b.positions)
        hit = np.isin(positions, wanted)
        if hit.any():
            pos.append(positions[hit])
            rows.append(a[np.asarray(b.rows)[hit]])
    node = _node()
    return np.concatenate(pos), np.concatenate(rows), node, _moved(panel, node)


@ray.remote(num_cpus=0)
def manifest_digest(folder: RunFolder) -> str | None:
    """The SHA-256 of a vector store's manifest as this node reads it (None: it cannot): which nodes share a local
    run folder's disk."""
    try:
        return hashlib.sha256(folder.read_bytes(MANIFEST)).hexdigest()
    except OSError:
        return None


@dataclass(frozen=True)
class StoredBlock:
    """A block not yet in the object store: read from the run's store (checksum verified) when a product needs it."""

    folder: RunFolder
    meta: BlockMeta
    local: bool  # the store is a local folder: read on the driver's node


class Shards:
    """G in panels of blocks, each block an object-store ref or a StoredBlock loaded on first use; G u and G[rows]
    as tasks near the blocks, in the run's metric (root: the diagonal Fisher's M^1/2, None: Euclidean)."""

    def __init__(self, n: int, p: int, panels: list[Panel], sources: dict, root: np.ndarray | None,
                 driver_node: str | None, cache: KeptRows | None = None):
        self.n, self.p, self.panels, self.sources, self.root = n, p, panels, dict(sources), root
        self.driver_node = driver_node
        self.here = _node()  # where the rows and products go (the solver actor's node)
        self.cache = cache  # rows a prior valuation kept (raw float32), read before any block
        self.owner = np.empty(n, dtype=np.intp)  # the panel holding each position
        for k, panel in enumerate(panels):
            self.owner[panel.positions] = k
        self.stats = {"passes": 0, "pass_seconds": 0.0, "row_reads": 0, "rows_from_blocks": 0, "bytes_moved": 0,
                      "bytes_to_solver": 0, "rows_cached": 0, "tasks_per_node": {}, "blocks_loaded": 0}

    def _submit_loads(self, panels: list[Panel]) -> None:
        """Start reading every stored block of `panels` into the object store (the driver's node if local), all at
        once: a pass over G then waits for the slowest read, not for their sum."""
        for panel in panels:
            for b in panel.blocks:
                src = self.sources[b.file]
                if isinstance(src, StoredBlock):  # first use
                    opts = {}
                    if src.local and self.driver_node is not None:
                        opts = {"scheduling_strategy": NodeAffinitySchedulingStrategy(self.driver_node, soft=False)}
                    self.sources[b.file] = tuple(load_block.options(**opts).remote(src.folder, src.meta))
                    self.stats["blocks_loaded"] += 1

    def _refs(self, panel: Panel) -> list:
        self._submit_loads([panel])
        out = []
        for b in panel.blocks:
            src = self.sources[b.file]
            if isinstance(src, tuple):  # a load submitted earlier: its checksum must have held
                why = ray.get(src[0])
                if why is not None:
                    raise OSError(f"a stored block failed its checksum when a product read it: {why}")
                self.sources[b.file] = src = src[1]
            out.append(src)
        return out

    def _count(self, node: str, moved: int, back: int) -> None:
        """A task on `node` that read `moved` block bytes from other nodes and sent `back` bytes here."""
        per = self.stats["tasks_per_node"]
        per[node] = per.get(node, 0) + 1
        self.stats["bytes_moved"] += int(moved)
        if node != self.here:
            self.stats["bytes_to_solver"] += int(back)

    def times(self, u: np.ndarray) -> np.ndarray:
        """G u (in the metric) for all n rows: one task per panel."""
        t0 = time.perf_counter()
        u = np.asarray(u, np.float64) * (1.0 if self.root is None else self.root)
        u_ref = ray.put(u)
        self._submit_loads(self.panels)  # a pass reads every block: the first one's reads all start now
        calls = [(panel, panel_times.options(**near(panel)).remote(panel, u_ref, *self._refs(panel)))
                 for panel in self.panels]
        out = np.empty(self.n)
        for panel, call in calls:
            values, node, moved = ray.get(call)
            out[panel.positions] = values
            self._count(node, moved, values.nbytes + u.nbytes)  # u out, G u back
        self.stats["passes"] += 1
        self.stats["pass_seconds"] += time.perf_counter() - t0
        return out

    def rows(self, idx: np.ndarray) -> np.ndarray:
        """G[idx] (float64, in the metric) for sorted positions idx: one task per panel holding any."""
        idx = np.asarray(idx, np.intp)
        out = np.empty((idx.size, self.p))
        calls, todo = [], idx
        if self.cache is not None and self.cache.at.size:
            at = np.minimum(np.searchsorted(self.cache.at, idx), self.cache.at.size - 1)
            hit = self.cache.at[at] == idx
            out[hit] = self.cache.rows[at[hit]]
            todo = idx[~hit]
            self.stats["rows_cached"] += int(hit.sum())
        for k in np.unique(self.owner[todo]):
            panel = self.panels[k]
            wanted = todo[self.owner[todo] == k]
            calls.append(panel_rows.options(**near(panel)).remote(panel, wanted, *self._refs(panel)))
        for call in calls:
            pos, X, node, moved = ray.get(call)
            at = np.searchsorted(idx, pos)
            out[at] = X
            self._count(node, moved, X.nbytes)
        if self.root is not None:
            out *= self.root
        self.stats["row_reads"] += 1
        self.stats["rows_from_blocks"] += int(todo.size)
        return out

    def keep(self, positions: np.ndarray) -> KeptRows:
        """The raw rows at sorted `positions` (Euclidean), as a valuation keeps them."""
        return KeptRows(at=np.asarray(positions, np.intp), rows=self.rows(positions).astype(np.float32))

    def operator(self, beta: np.ndarray, diag: np.ndarray) -> ShardedGradients:
        """The solver's view of these shards."""
        near = None
        if self.cache is not None:
            near = np.zeros(self.n, dtype=bool)
            near[self.cache.at] = True
        return ShardedGradients(n=self.n, p=self.p, beta=beta, diag=diag, times=self.times, rows=self.rows, near=near)


@dataclass(frozen=True, eq=False)
class KeptRows:
    """Rows of G a valuation keeps (raw, float32) at sorted positions of its pool."""

    at: np.ndarray
    rows: np.ndarray


@dataclass(frozen=True, eq=False)
class ShardedProblem:
    """What the sharded solve needs besides the blocks: the problem in the run's metric and how to solve it."""

    n: int
    p: int
    g_tar: np.ndarray  # in the metric (g / M^1/2 for the diagonal Fisher)
    beta: np.ndarray
    diag: np.ndarray
    root: np.ndarray | None
    gamma: float | None
    budget: float | None
    costs: np.ndarray | None
    normalize: str
    tol: float | None
    shard: ShardPolicy
    prior: Prior | None = None
    policy: SolverPolicy = DEFAULT_POLICY
    cache: KeptRows | None = None  # rows a prior valuation kept
    keep_from: np.ndarray | None = None  # the candidates whose rows the next state may keep (None: any)


@ray.remote(num_cpus=0, max_restarts=0)
class ShardedSolver:
    """Drives one sharded solve; holds no CPU, since it waits while its product tasks run and they wait while it
    solves a working set."""

    def solve(self, problem: ShardedProblem, panels: list[Panel], sources: dict,
              driver_node: str | None) -> tuple[KMMSolution, dict, KeptRows | None]:
        """(the solution, the shards' statistics, the rows the valuation keeps: Euclidean only)."""
        shards = Shards(problem.n, problem.p, panels, sources, problem.root, driver_node, problem.cache)
        sol = solve_sharded(shards.operator(problem.beta, problem.diag), problem.g_tar, gamma=problem.gamma,
                            budget=problem.budget, costs=problem.costs, normalize=problem.normalize, tol=problem.tol,
                            policy=problem.policy, shard=problem.shard, prior=problem.prior)
        kept = None
        if problem.root is None:
            left = sol.info["residuals"]
            allowed = problem.keep_from
            if allowed is not None and left.held is not None:
                allowed = allowed.copy()
                allowed[left.held] = True  # rows this solve read are in blocks it loaded
            kept = shards.keep(rows_to_keep(sol.w, left.residual, left.held, problem.shard.keep_rows_bytes //
                                            (4 * problem.p), allowed))
        return sol, shards.stats, kept

    def residuals(self, panels: list[Panel], sources: dict, n: int, p: int, beta: np.ndarray, diag: np.ndarray,
                  w: np.ndarray, normalize: str, keep_rows: int) -> tuple[Residuals, KeptRows]:
        """r~ = K~ w - beta~ for all rows (normalised space) and u = G~^T w: the support's rows read, then one pass
        (Euclidean; for the state a grown pool's valuation starts from)."""
        shards = Shards(n, p, panels, sources, None, None)
        s = 1.0 / np.sqrt(diag) if normalize == "cosine" else np.ones(n)
        on = np.flatnonzero(w)
        u = (s[on] * w[on]) @ shards.rows(on) if on.size else np.zeros(p)
        r = s * shards.times(u) - s * beta
        left = Residuals(residual=r, ref=np.zeros(n, dtype=np.intp), u_refs=u[None])
        return left, shards.keep(rows_to_keep(w, r, None, keep_rows))


def solve_sharded_on_actor(problem: ShardedProblem, panels: list[Panel],
                           sources: dict) -> tuple[KMMSolution, dict, KeptRows | None]:
    """The sharded solve on a ShardedSolver actor of its own, on the driver's node (soft): (solution, statistics,
    with where G lived: bytes per node, and the bytes the tasks moved)."""
    here = ray.get_runtime_context().get_node_id()
    actor = ShardedSolver.options(scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=True)).remote()
    try:
        # the refs ride inside a dict, so the actor receives them unresolved and hands them to its tasks
        sol, stats, kept = ray.get(actor.solve.remote(problem, panels, sources, here))
    finally:
        ray.kill(actor)
    held: dict[str, int] = {}
    for panel in panels:
        for b in panel.blocks:
            held[b.node or "store"] = held.get(b.node or "store", 0) + b.nbytes
    stats = stats | {"block_bytes_per_node": held, "panels": len(panels),
                     "pass_seconds": round(stats["pass_seconds"], 3)}
    return sol, stats, kept


def residuals_on_actor(panels: list[Panel], sources: dict, n: int, p: int, beta: np.ndarray, diag: np.ndarray,
                       w: np.ndarray, normalize: str, keep_rows: int) -> tuple[Residuals, KeptRows]:
    """ShardedSolver.residuals on an actor of its own (the support's rows reach the driver only as the kept rows)."""
    here = ray.get_runtime_context().get_node_id()
    actor = ShardedSolver.options(scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=True)).remote()
    try:
        return ray.get(actor.residuals.remote(panels, sources, n, p, beta, diag, w, normalize, keep_rows))
    finally:
        ray.kill(actor)


def problem_of(spec: SolveSpec, n: int, g_tar: np.ndarray, gram: GramResult, shard: ShardPolicy,
               prior: Prior | None = None, cache: KeptRows | None = None,
               keep_from: np.ndarray | None = None) -> ShardedProblem:
    """The sharded problem of a run's solve spec and its Gram stage's statistics (beta, K's diagonal and the metric,
    computed where the blocks live)."""
    root = None if gram.M is None else np.sqrt(gram.M)
    g = np.asarray(g_tar, np.float64)
    if root is not None:
        g = np.divide(g, root, out=np.zeros_like(g), where=root > 0)
    spec = spec.resolved(gram.beta, gram.diag)  # gamma_ratio -> this problem's absolute gamma
    return ShardedProblem(n=n, p=int(g.size), g_tar=g, beta=gram.beta, diag=gram.diag, root=root, gamma=spec.gamma,
                          budget=spec.budget, costs=spec.costs, normalize=spec.normalize, tol=spec.tol, shard=shard,
                          prior=prior, cache=cache, keep_from=keep_from)
