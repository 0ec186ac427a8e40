"""`convalue score VECTORS`: value a pool whose vectors already exist — a Parquet of (group, vector) rows made by
another tool, or an earlier run's folder — without loading a model: the vectors are imported into a new run
folder's store as blocks (streamed, never all in memory), then the Gram (or the gradient-space problem), the KMM
solve, the selection, scores.parquet, summary.json and report.html follow as in a run."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from convalue.engine.data.prepare import TARGET_KEY
from convalue.engine.driver.appended import leading_unchanged, row_group_digests
from convalue.engine.driver.timer import Timer
from convalue.engine.driver.views import write_view
from convalue.engine.files.errors import StoreError
from convalue.engine.files.folder import RunFolder, as_folder, file_location
from convalue.engine.files.locks import run_folder_lock
from convalue.engine.report.tables import format_ranking, scores_table
from convalue.engine.selection.incremental import STATE_FILE
from convalue.engine.selection.select import select_top_k
from convalue.engine.selection.solve import SolveSpec
from convalue.engine.store.artifacts import package_versions
from convalue.engine.store.record import RunRecord
from convalue.engine.store.stage_records import (
    EndRecord,
    ImportRecord,
    SelectionRecord,
    StartRecord,
    ValuationRecord,
    assemble,
)
from convalue.engine.store.summary import RunSummary, SolverRecord
from convalue.engine.store.vectors import LEGACY_KEY, VectorStore
from convalue.solvers.sharded import DEFAULT_SHARD_POLICY, ShardPolicy

log = logging.getLogger("convalue")
IMPORT_BLOCK_ROWS = 1024  # rows per imported block (and per Parquet batch read)


@dataclass(frozen=True)
class ScoreRequest:
    """What `convalue score` values and how."""

    vectors: str  # a Parquet file (group, vector[, n_examples]) or an earlier run folder, local or URI
    out: str
    name: str
    target: str | None = None  # a .npy or one-row Parquet (vector) file; None: the `target_group` row, or a run's
    target_group: str = TARGET_KEY
    gamma: float | None = None
    gamma_ratio: float | None = None
    budget: float | None = None
    normalize: str = "cosine"
    metric: str = "euclidean"
    space: str = "auto"
    k: int = 3
    overwrite: bool = False
    shard: ShardPolicy = DEFAULT_SHARD_POLICY  # how much of G one process may gather (gradient space)


def _vector_array(column: pa.ChunkedArray | pa.Array, where: str) -> np.ndarray:
    """A list or fixed-size-list column of floats as an [rows, p] float32 array (ragged rows refused)."""
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if pa.types.is_fixed_size_list(arr.type):
        return arr.flatten().to_numpy(zero_copy_only=False).astype(np.float32).reshape(len(arr), arr.type.list_size)
    if not (pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type)):
        raise StoreError(f"{where}: column `vector` must be a list of numbers, got {arr.type}")
    lengths = np.diff(arr.offsets.to_numpy())
    if len(lengths) and (lengths.min() != lengths.max() or lengths.min() == 0):
        raise StoreError(f"{where}: rows of `vector` have lengths {int(lengths.min())}..{int(lengths.max())}; "
                         "every vector must have the same dimension p > 0")
    p = int(lengths[0]) if len(lengths) else 0
    return arr.flatten().to_numpy(zero_copy_only=False).astype(np.float32).reshape(len(arr), p)


def _parquet_batches(source: RunFolder, name: str,
                     first_group: int = 0) -> Iterator[tuple[list[str], np.ndarray, list[int]]]:
    """(groups, vectors, n_examples) of a vectors Parquet from row group `first_group` on, IMPORT_BLOCK_ROWS rows at
    a time."""
    where = source / name
    with source.fs.open_input_file(source.path(name)) as fh:
        try:
            # no pre-buffering: it keeps every row group read so far (1 GB after 250 of 293 batches at N = 300,000)
            pf = pq.ParquetFile(fh, pre_buffer=False)
        except pa.ArrowInvalid as exc:
            raise StoreError(f"{where}: not a Parquet file ({exc})") from None
        missing = [c for c in ("group", "vector") if c not in pf.schema_arrow.names]
        if missing:
            raise StoreError(f"{where}: missing column(s) {missing} (expected group, vector[, n_examples])")
        cols = ["group", "vector"] + (["n_examples"] if "n_examples" in pf.schema_arrow.names else [])
        groups_from = range(first_group, pf.metadata.num_row_groups)
        for batch in pf.iter_batches(batch_size=IMPORT_BLOCK_ROWS, columns=cols, row_groups=groups_from):
            groups = batch.column("group").to_pylist()
            if any(not isinstance(g, str) or not g for g in groups):
                raise StoreError(f"{where}: column `group` must hold non-empty names")
            X = _vector_array(batch.column("vector"), str(where))
            if not np.all(finite := np.isfinite(X).all(axis=1)):
                bad = [g for g, ok in zip(groups, finite) if not ok]
                raise StoreError(f"{where}: non-finite values (NaN or infinity) in the vector of group(s) "
                                 f"{', '.join(map(repr, bad[:5]))}{f' and {len(bad) - 5} more' if len(bad) > 5 else ''}")
            n = batch.column("n_examples").to_pylist() if "n_examples" in cols else [0] * len(groups)
            yield groups, X, [int(v or 0) for v in n]


def _run_batches(source: RunFolder) -> Iterator[tuple[list[str], np.ndarray, list[int]]]:
    """The vectors of an earlier run's store, block by block."""
    store = VectorStore.reader(source.sub("vectors"))
    for meta in store.blocks.values():
        X, counts = store.load(meta.groups)
        yield meta.groups, X, [counts[g] for g in meta.groups]


def _target(req: ScoreRequest) -> np.ndarray | None:
    """The target vector from --target (None: a row of the vectors is the target)."""
    if req.target is None:
        return None
    folder, name = file_location(req.target)
    if name.endswith(".npy"):
        g = np.load(io.BytesIO(folder.read_bytes(name)), allow_pickle=False)
    else:
        g = _vector_array(pq.read_table(pa.BufferReader(folder.read_bytes(name)), columns=["vector"]).column("vector"),
                          req.target)
    g = np.asarray(g, np.float32).reshape(-1) if np.ndim(g) == 1 or len(g) == 1 else None
    if g is None or not np.all(np.isfinite(g)):
        raise StoreError(f"{req.target}: the target must be one finite vector")
    return g


def row_keys(X: np.ndarray) -> list[str]:
    """Each row's key in the store: a digest of its float32 bytes (the same group with the same vector is reused)."""
    X = np.ascontiguousarray(X, np.float32)
    return ["v" + hashlib.blake2b(row.tobytes(), digest_size=8).hexdigest() for row in X]


def source_signature(req: ScoreRequest) -> dict:
    """What identifies the request's inputs as imported: each file's size and modification time, or a run folder's
    vector manifest (a store imported from the same signature is read again without a scan)."""
    out = {}
    for what, path in (("vectors", req.vectors), ("target", req.target)):
        if path is None:
            continue
        folder = as_folder(path)
        if folder.is_dir():
            out[what] = hashlib.sha256(folder.sub("vectors").read_bytes("manifest.json")).hexdigest()
        else:
            parent, name = file_location(path)
            info = parent.fs.get_file_info(parent.path(name))
            out[what] = [info.size, info.mtime_ns]
    return out


def import_vectors(req: ScoreRequest, store: VectorStore) -> tuple[list[str], int, int]:
    """Write the request's vectors (and target) into store as blocks, each row not already stored there (a grown
    file imports its new rows only); (candidate names in file order, p, rows decoded)."""
    source = as_folder(req.vectors)
    is_run = source.is_dir() and source.sub("vectors").is_file("manifest.json")
    g = _target(req)
    names, seen, p, stored, decoded = [], set(), None, store.done(), 0
    if is_run:
        batches = _run_batches(source)
    else:
        folder, name = file_location(req.vectors)
        if not folder.is_file(name):
            raise FileNotFoundError(f"{req.vectors}: no such vectors file or run folder")
        digests = row_group_digests(folder, name)
        before = [n for n in store.state.get("groups", []) if n != TARGET_KEY]
        k = leading_unchanged(digests, store.state.get("row_groups")) if g is not None else 0
        rows = sum(r for _, r in digests[:k])
        if k and rows <= len(before) and all(n in stored for n in before[:rows]):  # imported before, unchanged
            names, seen, p = before[:rows], set(before[:rows]), int(store.state["dim"])
        else:
            k = 0
        batches = _parquet_batches(folder, name, k)
    for groups, X, counts in batches:
        decoded += len(groups)
        for n in groups:
            if n in seen:
                raise StoreError(f"{req.vectors}: group {n!r} appears twice")
            seen.add(n)
        p = p or X.shape[1]
        if X.shape[1] != p:
            raise StoreError(f"{req.vectors}: vectors of dimension {X.shape[1]} beside {p}")
        rename = [TARGET_KEY if (g is None and n == req.target_group) else n for n in groups]
        keys = row_keys(X)
        fresh = [i for i, (n, k) in enumerate(zip(rename, keys)) if stored.get(n) not in (k, LEGACY_KEY)]
        if changed := [rename[i] for i in fresh if rename[i] in stored]:
            raise StoreError(f"{req.vectors}: the vectors of {changed[:5]} differ from those imported before; "
                             "import afresh with --overwrite")
        if fresh:  # a row imported before (the same group, the same vector) stays in its block
            store.write_block([rename[i] for i in fresh], [keys[i] for i in fresh], [counts[i] for i in fresh],
                              [0] * len(fresh), X[fresh])
        names += [n for n in rename if n != TARGET_KEY]
    if g is not None:
        if p is not None and g.shape[0] != p:
            raise StoreError(f"{req.target}: a target of dimension {g.shape[0]} for vectors of dimension {p}")
        if stored.get(TARGET_KEY) != (key := row_keys(g[None, :])[0]):
            store.write_block([TARGET_KEY], [key], [0], [0], g[None, :])
    elif TARGET_KEY not in store.done():
        raise StoreError(f"{req.vectors}: no target: give --target FILE, or name its row with --target-group "
                         f"(no row named {req.target_group!r})")
    if not names:
        raise StoreError(f"{req.vectors}: no candidate vectors")
    if not is_run:  # recorded once every row is stored: the next import of a grown file skips these row groups
        store.state["row_groups"] = digests
    return names, int(p), decoded


def score(req: ScoreRequest) -> RunSummary:
    """Import, value and write the run folder <out>/<name>; returns its summary (Ray starts for the Gram and the
    solve: an embedded one unless RAY_ADDRESS names a cluster)."""
    # the solver loads only when vectors are scored: the CLI imports this module for every command
    from convalue.engine.config import ConfigError, SolverConfig
    from convalue.engine.driver.checks import (
        check_k_fits,
        check_nonzero,
        choose_space,
        make_run_folder,
    )

    # the driver-side valuation: NumPy and the solvers, no Ray
    from convalue.engine.driver.prior import load_prior, value_in_driver

    SolverConfig(gamma=req.gamma, gamma_ratio=req.gamma_ratio, budget=req.budget,
                 normalize=req.normalize).validate()  # the same checks, and messages, as a config's solver section
    if req.k < 1:
        raise ConfigError("must be at least 1", field="--k", value=req.k)
    for path, what in ((req.vectors, "vectors file or run folder"), (req.target, "target file")):
        if path is not None and not (as_folder(path).is_dir() or file_location(path)[0].is_file(file_location(path)[1])):
            raise FileNotFoundError(f"{path}: no such {what}")
    record = RunRecord.of(req.out, req.name)
    run_dir = record.folder
    timer, t0 = Timer(), time.perf_counter()
    make_run_folder(run_dir, "--out", req.out)
    with run_folder_lock(run_dir):
        record.open()
        start = StartRecord(packages=package_versions(), config={
            "import": {"vectors": req.vectors, "target": req.target, "target_group": req.target_group},
            "select": {"k": req.k}, "features": {"metric": req.metric},
            "solver": {"gamma": req.gamma, "gamma_ratio": req.gamma_ratio, "budget": req.budget,
                       "normalize": req.normalize}})
        record.begin(assemble([start, EndRecord(status="running")]))
        records: list[object] = [start]
        end = EndRecord(status="complete")
        started = False
        try:
            with timer.stage("import"):
                store = VectorStore(run_dir.sub("vectors"), {"imported": req.vectors, "target": req.target},
                                    overwrite=req.overwrite)
                if req.overwrite:
                    store.forget_import()
                signature = source_signature(req)
                if store.state.get("complete") and store.state.get("groups") and \
                        store.state.get("source", signature) == signature:  # imported before: read it again
                    names, p = [n for n in store.state["groups"] if n != TARGET_KEY], int(store.state["dim"])
                    decoded = 0
                else:
                    names, p, decoded = import_vectors(req, store)
                    store.state["source"] = signature
                    store.mark_complete([TARGET_KEY, *names])
            check_k_fits(req.k, len(names), "--k")
            records.append(ImportRecord(data={"target": req.target or req.target_group, "candidates": len(names),
                                              "p": p, "rows_decoded": decoded}))
            space = choose_space(req.space, len(names))
            prior = None if req.overwrite else load_prior(run_dir)  # --overwrite: valued afresh
            spec = SolveSpec(gamma=req.gamma, gamma_ratio=req.gamma_ratio, budget=req.budget,
                             normalize=req.normalize, rank_bound=p, metric=req.metric, space=space)
            # a grown pool the prior still certifies is valued here, from its new rows alone: no cluster starts
            here = None if prior is None else value_in_driver(
                spec, names, store, prior, timer, req.shard,
                check=lambda gram: check_nonzero(None, names, gram.row_norm2, prior.state.target))
            if here is not None:
                done = here
            else:
                # Ray and the actors load only here: a prior certified in the driver needs neither
                from convalue.engine.driver.incremental import value_rows
                from convalue.engine.driver.pool import load_pool
                from convalue.engine.driver.session import connect_default

                started = connect_default()
                with timer.stage("load"):  # in gradient space with a prior, only the blocks of new rows
                    features, sources = load_pool(store, names, prior if space == "gradients" else None,
                                                  req.metric, req.normalize)
                done = value_rows(spec, names, features.blocks, sources, features.g_tar, timer, prior=prior,
                                  shard=req.shard,
                                  check=lambda gram: check_nonzero(None, names, gram.row_norm2, features.g_tar))
            gram, spec, sol = done.gram, done.spec, done.sol
            solver = SolverRecord.from_solution(sol, spec.normalize, spec.rank_bound)
            if req.gamma_ratio is not None:
                solver.info["gamma_ratio"] = req.gamma_ratio
            records.append(ValuationRecord(featurize=None, order=names, space=space, solver=solver,
                                           gram={k: v for k, v in gram.stats.items() if k != "tile_detail"}))
            selected = select_top_k(sol.w, gram.beta, req.k)
            table = scores_table(names, [0] * len(names), [0] * len(names), sol.w, gram.beta, gram.cosine, selected)
            record.write_npy("beta.npy", gram.beta)
            if gram.K is not None:
                record.write_npy("gram.npy", gram.K)
            record.write_parquet("scores.parquet", table)
            record.write_bytes(STATE_FILE, done.state.to_bytes())
            records.append(SelectionRecord(selected=[names[i] for i in selected],
                                           ranking=format_ranking(table, limit=50).splitlines()))
        except BaseException as exc:
            end = EndRecord(status="failed", error=f"{type(exc).__name__}: {exc}")
            raise
        finally:
            if started:
                import ray  # only where this command started Ray itself

                ray.shutdown()
            end = dataclasses.replace(end, timings_s=timer.seconds | {"total": round(time.perf_counter() - t0, 3)})
            summary = assemble(records + [end])
            write_view(record, record.finish(summary))
    return summary
