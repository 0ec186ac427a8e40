"""`convalue solve RUN_DIR`: re-solve a finished run from its saved K and beta (or its stored vectors), in this
process and without Ray; everything is read and checked before anything is written."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from convalue.engine.config import ConfigError
from convalue.engine.data.prepare import TARGET_KEY
from convalue.engine.driver.views import write_view
from convalue.engine.files.errors import StoreError
from convalue.engine.files.folder import RunFolder, as_folder
from convalue.engine.files.locks import run_folder_lock
from convalue.engine.protocol.evaluate import PlannedRun, mix_runs
from convalue.engine.report.plots import plot_scores
from convalue.engine.report.tables import format_ranking, scores_table
from convalue.engine.selection.bootstrap import outputs as bootstrap_outputs
from convalue.engine.selection.bootstrap import resample_run
from convalue.engine.selection.select import select_top_k
from convalue.engine.selection.solve import SolveSpec
from convalue.engine.store.artifacts import read_npy
from convalue.engine.store.record import RunRecord
from convalue.engine.store.stage_records import ResolveRecord, assemble
from convalue.engine.store.summary import (
    METRICS,
    SPACES,
    RunSummary,
    SolverRecord,
)
from convalue.engine.store.vectors import VectorStore
from convalue.solvers import KMMInputError


def resolve(run_dir: RunFolder | Path | str, *, gamma: float | None, budget: float | None, method: str | None,
            normalize: str | None, tol: float | None = None) -> RunSummary:
    """Re-solve a saved run (no gradients recomputed) from gram.npy/beta.npy, or from its stored vectors when
    it was solved in gradient space; rewrites its scores (a local folder or a filesystem URI). tol: as
    `solver.tol`; None keeps the run's own where the form stays penalised with convalue's solver."""
    run_dir = as_folder(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"{run_dir}: not a finished run folder (no such folder)")
    if run_dir.local is not None and not os.access(run_dir.local, os.W_OK | os.X_OK):
        raise StoreError(f"{run_dir}: cannot be written by this process (permission denied); a re-solve rewrites "
                         "the scores in place: copy the folder somewhere writable and solve the copy")
    with run_folder_lock(run_dir):
        return _resolve(run_dir, gamma=gamma, budget=budget, method=method, normalize=normalize, tol=tol)


def saved_summary(run_dir: RunFolder) -> RunSummary:
    """summary.json of a finished run folder, checked for what a re-solve reads; errors name the file and field."""
    path = run_dir / "summary.json"
    summary = RunSummary.read(run_dir, "not a finished run folder (summary.json needed)")
    if summary.status == "running":  # a live run holds the folder's lock, so this one was killed
        raise StoreError(f"{path}: field `status` is \"running\": the run was stopped before it finished "
                         "(run it again with `convalue run`)")
    if summary.status == "failed" and (summary.order is None or not run_dir.is_file("beta.npy")):
        raise StoreError(f"{path}: the run failed in stage {summary.failed_stage or '?'} before it had scores to "
                         f"re-solve ({summary.error or 'no error recorded'}); fix that and run it again with "
                         "`convalue run`")
    order = summary.order
    if (not isinstance(order, list) or not order or not all(isinstance(n, str) for n in order)
            or len(set(order)) != len(order)):
        raise StoreError(f"{path}: field `order` must list the run's candidate names, each once "
                         f"(got {json.dumps(order)[:80]})")
    k = summary.select_k
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise StoreError(f"{path}: field `config.select.k` must be an integer >= 1 (got {json.dumps(k)})")
    tunes = summary.finetune or []
    ok = {"finetune": all(isinstance(t, dict) and isinstance(t.get("groups"), list)
                          and (t.get("method") != "kmm" or (type(t.get("k")) is int and t["k"] >= 1))
                          and _weights_ok(t.get("weights"), t["groups"]) for t in tunes),
          "space": (summary.space or "gram") in SPACES,
          "config.features.metric": summary.space != "gradients" or summary.metric_kind in METRICS}
    if bad := [name for name, good in ok.items() if not good]:
        raise StoreError(f"{path}: field `{bad[0]}` is malformed")
    return summary


def _weights_ok(weights: object, groups: list) -> bool:
    """A fine-tune row's mixture weights: absent (uniform) or a number for each of its groups."""
    return weights is None or (isinstance(weights, dict) and set(weights) == set(groups) and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) for v in weights.values()))


def _load_saved(run_dir: RunFolder, name: str, checksums: dict[str, str] | None = None) -> np.ndarray:
    """A saved .npy array of a run folder (checked against its recorded SHA-256), or a StoreError naming the file."""
    try:
        return read_npy(run_dir, name, (checksums or {}).get(name))
    except (OSError, ValueError, EOFError) as exc:
        raise StoreError(f"{run_dir / name}: not a readable .npy array ({exc})") from None


def _store(run_dir: RunFolder) -> VectorStore:
    return VectorStore.reader(run_dir.sub("vectors"))


def stored_vectors(run_dir: RunFolder, order: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(G, g_tar) of a finished run from its vector store, in the row order `order` (raw, not in the metric)."""
    store = _store(run_dir)
    G, _ = store.load(order)
    return G, store.load([TARGET_KEY])[0][0]


def _saved_scores(run_dir: RunFolder, order: list[str]) -> dict[str, dict]:
    """scores.parquet's rows by group, which must be exactly the groups of summary.json's order."""
    path = run_dir / "scores.parquet"
    if not run_dir.is_file("scores.parquet"):
        raise StoreError(f"{path}: missing (the run folder is incomplete)")
    try:
        table = pq.read_table(pa.BufferReader(run_dir.read_bytes("scores.parquet")))
    except Exception as exc:  # pyarrow raises several types for unreadable files
        raise StoreError(f"{path}: not a readable Parquet file ({exc})") from None
    needed = ["group", "n_examples", "n_preview", "cosine"]
    if missing := [c for c in needed if c not in table.column_names]:
        raise StoreError(f"{path}: missing column(s) {missing}")
    rows = table.select(needed).to_pylist()
    by_name = {r["group"]: r for r in rows}
    if len(rows) != len(order) or set(by_name) != set(order):
        extra, absent = sorted(set(by_name) - set(order)), sorted(set(order) - set(by_name))
        raise StoreError(f"{path}: its {len(rows)} rows do not match summary.json's order of {len(order)} groups "
                         f"(not in order: {extra[:5]}, no row: {absent[:5]})")
    return by_name


def _bootstrap(run_dir: RunFolder, summary: RunSummary, spec: SolveSpec, w: np.ndarray, beta: np.ndarray,
               selected: list[int]) -> tuple[object, dict]:
    """The run's bootstrap (same samples and seed) for a re-solve's spec, in this process; (table, summary)."""
    boot = summary.config_section("bootstrap")
    samples, seed = boot.get("samples"), boot.get("seed")
    if type(samples) is not int or samples < 1 or type(seed) is not int:
        raise StoreError(f"{run_dir / 'summary.json'}: field `config.bootstrap` must hold samples >= 1 and an "
                         f"integer seed (got {json.dumps(summary.config.get('bootstrap'))[:80]})")
    names = summary.order
    examples = _store(run_dir).load_examples(names + [TARGET_KEY])
    W, S = resample_run(examples, names, spec, summary.select_k, samples, seed)
    return bootstrap_outputs(names, w, beta, selected, W, S, seed)


def _kmm_runs(summary: RunSummary) -> list[dict]:
    """The saved fine-tune rows of KMM's selections, each with its k (a summary written before the evaluation
    protocol lists KMM's top-select.k run first, without `method` and `k`)."""
    rows = summary.finetune or []
    if rows and "method" not in rows[0]:
        return [rows[0] | {"k": summary.select_k}]
    return [r for r in rows if r.get("method") == "kmm"]


def _kmm_changed(summary: RunSummary, names: list[str], w: np.ndarray, beta: np.ndarray) -> list[int]:
    """The evaluated k whose KMM fine-tunes no longer match the solution w: other groups bought or, with
    finetune.mixture softmax, other mixture weights."""
    tuned = summary.config_section("finetune")
    changed = set()
    for r in {r["k"]: r for r in _kmm_runs(summary)}.values():  # one row per k: its seeds share groups and weights
        groups = tuple(sorted(names[i] for i in select_top_k(w, beta, r["k"])))
        if list(groups) != r["groups"]:
            changed.add(r["k"])
        elif tuned.get("mixture") == "softmax":
            (now,) = mix_runs([PlannedRun("kmm", r["k"], groups)], "softmax", {"kmm": w}, names, {},
                              tuned.get("mixture_temperature", 1.0))
            old = r.get("weights")
            if (now.weights is None) != (old is None) or (old is not None and not np.allclose(
                    [old[g] for g in groups], now.weights, rtol=1e-9, atol=0)):
                changed.add(r["k"])
    return sorted(changed)


def _resolve(run_dir: RunFolder, *, gamma: float | None, budget: float | None, method: str | None,
             normalize: str | None, tol: float | None = None) -> RunSummary:
    summary = saved_summary(run_dir)
    names = summary.order  # the row order of gram.npy and beta.npy
    space = summary.space or "gram"
    if space == "gram" and not run_dir.is_file("gram.npy"):
        raise FileNotFoundError(f"{run_dir}: not a finished run folder (gram.npy needed)")
    old = summary.solver
    if gamma is None and budget is None and old is not None:
        gamma, budget = old.gamma, old.budget
    normalize = normalize or (old.normalize if old else "none")
    own_solver = method in (None, "auto", "active_set")  # convalue's, not the CVXPY reference
    if tol is None and gamma is not None and own_solver and old is not None:
        tol = old.info.get("tol")  # the run's own stopping tolerance, where it still applies
    if space != "gram" and not own_solver:
        raise ConfigError(f"{run_dir} was solved in gradient space (no gram.npy); this method needs the Gram",
                          field="method", value=method)
    files = ["beta.npy"] + (["gram.npy"] if space == "gram" else []) + (
        ["costs.npy"] if run_dir.is_file("costs.npy") else [])
    sums = {name: a.get("sha256") for name, a in (summary.artifacts or {}).items() if isinstance(a, dict)}
    arrays = {name: _load_saved(run_dir, name, sums) for name in files}
    beta = arrays["beta.npy"]
    if beta.ndim != 1 or len(beta) != len(names):
        raise StoreError(f"{run_dir / 'beta.npy'}: shape {beta.shape}, but summary.json's order lists "
                         f"{len(names)} groups")
    prev = _saved_scores(run_dir, names)
    rank_bound = old.rank_bound if old else None
    spec = SolveSpec(gamma=gamma, budget=budget, method=method or "auto", normalize=normalize, tol=tol,
                     costs=arrays.get("costs.npy"), rank_bound=rank_bound,
                     metric=summary.metric_kind if space == "gradients" else "euclidean", space=space)
    try:
        if space == "gram":
            sol = spec.solve_gram(arrays["gram.npy"], beta)
        else:
            problem = spec.problem(*stored_vectors(run_dir, names))
            sol = spec.solve(problem)
    except KMMInputError as exc:  # name the saved files the bad values came from
        sources = files + ([] if space == "gram" else ["vectors/"])
        raise KMMInputError(f"{run_dir} ({', '.join(sources)}): {exc}") from None
    selected = select_top_k(sol.w, beta, summary.select_k)
    cos = np.array([prev[n]["cosine"] for n in names])  # a property of the gradients, not of the solve
    table = scores_table(names, [prev[n]["n_examples"] for n in names], [prev[n]["n_preview"] for n in names],
                         sol.w, beta, cos, selected)
    boot = boot_stats = None
    if summary.bootstrap:  # the run's bootstrap, redone for the new solve (else it would describe the old)
        boot_spec = spec.replace(metric=summary.metric_kind or "euclidean")  # resamples start from raw vectors
        boot, boot_stats = _bootstrap(run_dir, summary, boot_spec, sol.w, beta, selected)
    # the new results are staged and swapped in whole: a re-solve stopped midway leaves the run as it was
    record = RunRecord(run_dir)
    record.open()
    record.begin(dataclasses.replace(summary, status="running"))
    record.write_png("scores.png", plot_scores(table))  # first, as in a run: a failed figure leaves no scores
    record.write_parquet("scores.parquet", table)
    if boot is not None:
        record.write_parquet("bootstrap.parquet", boot)
    record.carry(sorted(summary.artifacts or {}), summary)  # the rest of the run stays as it was
    # a re-solve that changes what KMM buys at any evaluated k (or its softmax mixture) leaves those fine-tunes
    # (and best-k, Borda) stale; one back to the tuned selections makes them current again
    changed = _kmm_changed(summary, names, sol.w, beta)
    stale = (f"the re-solve changed what KMM buys at k = {changed}; fine-tune results (and best k, Borda) are for "
             "the old selection") if changed else None
    solved = ResolveRecord(solver=SolverRecord.from_solution(sol, normalize, rank_bound),
                           selected=[names[i] for i in selected], ranking=format_ranking(table).splitlines(),
                           bootstrap=boot_stats, finetune_stale=stale)
    summary = assemble([solved], base=dataclasses.replace(summary, finetune_stale=None))
    write_view(record, record.finish(summary))
    return summary
