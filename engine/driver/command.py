"""The frame every command on a config runs in (`convalue run`, `faithfulness`, `transfer`): the model and data
stages, the run folder with its vector stores and its lock, Ray, each representation valued through stages.value,
the primary valuation written as a run writes it, and summary.json kept true throughout ("running" from the start,
"failed" with the stage and the error, what was recovered, report.html at the end)."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import ray

from convalue.actors.embedder import embed_on_workers
from convalue.actors.evaluation import FinetuneOutcome, Runners
from convalue.engine.config import RunConfig
from convalue.engine.data.clustering import EmbeddingCache
from convalue.engine.data.costs import load_costs
from convalue.engine.data.prepare import TARGET_KEY, PreparedData, prepare
from convalue.engine.driver import signals
from convalue.engine.driver.checks import check_projection, make_run_folder
from convalue.engine.driver.featurize import fingerprint
from convalue.engine.driver.live import LivePolicy, LiveProgress
from convalue.engine.driver.prior import load_prior
from convalue.engine.driver.session import RaySession, check_reachable, cluster_address
from convalue.engine.driver.stages import (
    Valuation,
    representation_config,
    value,
    vector_folder,
)
from convalue.engine.driver.timer import Timer
from convalue.engine.driver.views import write_view
from convalue.engine.features.rewards import check_rewards
from convalue.engine.files.folder import RunFolder
from convalue.engine.files.locks import run_folder_lock
from convalue.engine.model.digest import model_digest
from convalue.engine.model.loading import check_lora_targets_in, load_tokenizer, resolve_model
from convalue.engine.model.spec import ReplicaSpec
from convalue.engine.protocol.deepspeed import TrainJobSpec, ZeroSettings
from convalue.engine.report.plots import plot_scores
from convalue.engine.report.tables import (
    clusters_table,
    examples_table,
    format_ranking,
    scores_table,
)
from convalue.engine.selection.incremental import STATE_FILE
from convalue.engine.selection.select import select_top_k
from convalue.engine.store.artifacts import package_versions, write_npy
from convalue.engine.store.record import RunRecord
from convalue.engine.store.stage_records import (
    AttemptRecord,
    EndRecord,
    SelectionRecord,
    StartRecord,
    ValuationRecord,
    assemble,
)
from convalue.engine.store.summary import RunSummary, SolverRecord
from convalue.engine.store.vectors import VectorStore, fingerprint_matches

log = logging.getLogger("convalue")


def representations(cfg: RunConfig) -> list[str]:
    """The run's representations in order (features.representations, or features.representation alone)."""
    return list(cfg.features.representations or [cfg.features.representation])


def deepspeed_job_spec(cfg: RunConfig, model_dir: Path, digest: str):
    """The DeepSpeed fine-tune job spec (engine.protocol.deepspeed.TrainJobSpec) of finetune.strategy
    `deepspeed`, with finetune.model resolved, its LoRA targets checked and its content hashed; None otherwise."""
    if not (cfg.finetune.enabled and cfg.finetune.strategy == "deepspeed"):
        return None

    ft_dir, ft_digest = model_dir, digest
    if cfg.finetune.model is not None:
        ft_dir = resolve_model(dataclasses.replace(cfg.model, source=cfg.finetune.model, revision="main")).dir
        ft_digest = model_digest(ft_dir, Path(cfg.model.cache_dir).expanduser() / "digests")
        check_lora_targets_in(ft_dir, cfg.lora)
    return TrainJobSpec(str(ft_dir), cfg.finetune.dtype or cfg.model.dtype, cfg.model.max_length, cfg.finetune,
                        cfg.lora, ZeroSettings.from_config(cfg.finetune.deepspeed), cfg.finetune.deepspeed.cpus_per_worker,
                        ft_digest)


def _vector_folder(record: RunRecord, rep: str, primary: bool, fp: dict, overwrite: bool) -> RunFolder:
    """Where a representation's vectors are written: vectors/ (vectors-<rep>/ for the others), or, when --overwrite
    replaces vectors made with other settings in a folder that holds a complete run, a staged copy swapped in when
    the attempt completes."""
    folder = vector_folder(record.folder, rep, primary)
    if overwrite and record.protects and not fingerprint_matches(folder, fp):
        return record.staged(folder.root.rsplit("/", 1)[-1])
    return folder



def embedding_cache_dir(run_dir: RunFolder) -> Path:
    """Where a flat pool's embeddings are cached: the run folder's embeddings/ when it is local, else a local cache
    keyed by the run folder's URI (they are a cache: recomputed when absent)."""
    if run_dir.local is not None:
        return run_dir.local / "embeddings"
    return Path("~/.cache/convalue/embeddings").expanduser() / hashlib.sha256(run_dir.label.encode()).hexdigest()[:16]


@dataclass(eq=False)
class RunContext:
    """One command in flight: its config, model, data, folder, stores and Ray, its summary, and the stage a failure
    is recorded in."""

    cfg: RunConfig
    tokenizer: Any
    data: PreparedData
    costs: np.ndarray | None
    record: RunRecord  # writes every artifact; run_dir is its folder (fine-tune records and caches live there)
    stores: dict[str, VectorStore]
    session: RaySession
    timer: Timer
    records: list  # what each stage produced (engine.store.stage_records), assembled into summary.json at the end
    runners: Runners
    train_spec: Any
    replica: ReplicaSpec | None = None
    stage: str = "ray_init"
    outcome: FinetuneOutcome = field(default_factory=FinetuneOutcome)
    finetune_stages: set[str] = field(default_factory=set)  # stages whose finished fine-tunes a failure lists

    @property
    def run_dir(self) -> RunFolder:
        """The run folder."""
        return self.record.folder

    def add(self, record: object) -> None:
        """Keep a stage's record for summary.json."""
        self.records.append(record)

    def on_stage(self, name: str) -> None:
        """Record the stage a failure would be reported in."""
        self.stage = name

    def value(self, reps: list[str]) -> list[Valuation]:
        """Featurise, Gram and solve each representation; the primary's record (featurisation, Gram, order, space,
        metric, certificate) and the others' beside it are kept at once, so a run that fails later still has them."""
        valued = []
        for i, rep in enumerate(reps):
            valued.append(value(self.cfg, rep, self.data, self.stores[rep], self.replica, self.tokenizer, self.costs,
                                self.session.progress, self.timer, primary=i == 0, on_stage=self.on_stage,
                                prior=load_prior(self.run_dir) if i == 0 else None))
        main = valued[0]
        metric = None
        if main.gram.M is not None:
            metric = {"kind": self.cfg.features.metric, "support": int(np.count_nonzero(main.gram.M)),
                      "max_over_mean": round(float(main.gram.M.max()), 3)}
        solver = SolverRecord.from_solution(main.sol, main.spec.normalize, main.spec.rank_bound)
        if self.cfg.solver.gamma_ratio is not None:
            solver.info["gamma_ratio"] = self.cfg.solver.gamma_ratio
        self.add(ValuationRecord(
            featurize=main.features.stats.to_dict(), order=main.features.names, space=main.spec.space,
            gram={k: x for k, x in main.gram.stats.items() if k != "tile_detail"}, solver=solver, metric=metric,
            representations={v.representation: v.record() for v in valued[1:]} or None))
        return valued

    def selection(self, valued: list[Valuation]) -> list[int]:
        """The primary valuation's top select.k candidates (their rows in its order)."""
        main = valued[0]
        return select_top_k(main.sol.w, main.gram.beta, min(self.cfg.select.k, len(main.features.names)))

    def write_valuation(self, valued: list[Valuation]) -> None:
        """The primary representation's valuation as a run writes it (scores.png first: a figure that fails leaves
        no scores behind; gram.npy, beta.npy, costs.npy, scores.parquet; the selection and ranking), and the
        others' K and beta as gram-<tag>.npy and beta-<tag>.npy."""
        main, data, record = valued[0], self.data, self.record
        selected = self.selection(valued)
        table = scores_table(main.features.names, [len(g.examples) for g in data.candidates],
                             [len(it.examples) for it in data.items], main.sol.w, main.gram.beta, main.gram.cosine,
                             selected)
        record.write_png("scores.png", plot_scores(table))
        for v in valued:
            suffix = "" if v is main else f"-{v.tag}"
            if v.gram.K is not None:
                record.write_npy(f"gram{suffix}.npy", v.gram.K)
            record.write_npy(f"beta{suffix}.npy", v.gram.beta)
        if self.costs is not None:
            record.write_npy("costs.npy", self.costs)
        record.write_parquet("scores.parquet", table)
        if main.state is not None:  # what a valuation of a grown pool starts from
            record.write_bytes(STATE_FILE, main.state.to_bytes())
        self.add(SelectionRecord(selected=[main.features.names[i] for i in selected],
                                 ranking=format_ranking(table).splitlines()))

    def recovered(self) -> dict | None:
        """What the command survived, logged: work items retried and workers restarted (per stage), and damaged
        vector blocks set aside and computed again; None when nothing happened."""
        out = self.session.progress.recovery() if self.session.progress is not None else {}
        for stage, r in out.items():
            log.warning("%s: %d work item(s) ran again after a failure (%s), %d worker restart(s); results are "
                        "complete", stage, r["retries"], ", ".join(r["retried"][:5]) or "-", r["worker_restarts"])
        if dropped := [b for s in self.stores.values() for b in s.dropped]:
            out["vectors"] = {"blocks_set_aside": dropped}
        return out or None


def execute(cfg: RunConfig, command: str, precheck: Callable[[RunConfig], None],
            check: Callable[[RunConfig, PreparedData], None], body: Callable[[RunContext], None], *,
            address: str | None = None, overwrite: bool = False, runners: Runners | None = None,
            always_finetune: bool = False, live: LivePolicy | None = None) -> RunSummary:
    """Run a command: precheck(cfg) before anything, check(cfg, data) after the data stage (both raise before any
    work), then body(ctx) with Ray up and the summary open; returns the summary (also <out>/<name>/summary.json).
    always_finetune: the command fine-tunes whatever finetune.enabled says (which switches a run's evaluation);
    live: how often the running summary is refreshed with each stage's progress."""
    precheck(cfg)
    joined = cluster_address(cfg, address)
    if joined:
        if not ray.is_initialized():
            check_reachable(*joined)  # before the model and data stages, not after them
    session = RaySession(cfg, joined[0] if joined else None)
    try:
        return _execute(cfg, command, check, body, session, overwrite, runners or Runners(), always_finetune,
                        live or LivePolicy())
    finally:
        session.close()


def _execute(cfg: RunConfig, command: str, check: Callable[[RunConfig, PreparedData], None],
             body: Callable[[RunContext], None], session: RaySession, overwrite: bool, runners: Runners,
             always_finetune: bool, live: LivePolicy) -> RunSummary:
    timer = Timer(lambda: session.progress)
    t_start = time.perf_counter()
    if cfg.model.dtype == "bfloat16" and cfg.ray.gpus_per_worker == 0:
        log.warning("model.dtype bfloat16 on CPU workers (ray.gpus_per_worker 0): bf16 matmuls on a CPU without "
                    "bf16 units run far slower than float32")
    with timer.stage("model"):
        resolved = resolve_model(cfg.model)
        model_dir = resolved.dir
        digest = model_digest(model_dir, Path(cfg.model.cache_dir).expanduser() / "digests")
        tokenizer = load_tokenizer(model_dir)
        if cfg.features.parameters == "lora":
            check_lora_targets_in(model_dir, cfg.lora)
        check_projection(cfg, model_dir)
        ft_cfg = dataclasses.replace(cfg, finetune=dataclasses.replace(cfg.finetune, enabled=True)) \
            if always_finetune else cfg
        train_spec = deepspeed_job_spec(ft_cfg, model_dir, digest)
    record = RunRecord.of(cfg.out, cfg.name)
    run_dir = record.folder
    embed = None
    if any(src.clusters is not None for src in cfg.data.candidates):
        # a flat pool is embedded on Ray workers, so Ray starts before the data stage; embeddings kept in the
        # run folder (content-keyed) spare a rerun of the same pool, with another k or seed too, the embedding
        with timer.stage("ray_init"):
            session.up()
        embed = EmbeddingCache(embedding_cache_dir(run_dir), functools.partial(
            embed_on_workers, workers=cfg.ray.workers, cpus_per_worker=cfg.ray.cpus_per_worker,
            max_in_flight=cfg.ray.max_in_flight, progress=session.progress))
    with timer.stage("data"):
        data = prepare(cfg.data, tokenizer, cfg.model.max_length, grpo=cfg.features.representation == "grpo",
                       embed=embed)
        check(cfg, data)
        check_rewards(ft_cfg)  # user code imported as the run is about to call it, refused before featurisation
        costs = load_costs(cfg.solver.costs_file, data.names()) if cfg.solver.costs_file else None
    make_run_folder(run_dir, "out", cfg.out)
    with run_folder_lock(run_dir):  # no other run or re-solve writes here meanwhile
        record.open()
        # every representation's store opened (its settings checked) before the attempt begins; under --overwrite
        # a complete run's vectors are replaced only when this attempt completes
        stores = {rep: VectorStore(_vector_folder(record, rep, i == 0, fp := fingerprint(
                      representation_config(cfg, rep), digest), overwrite), fp, overwrite=overwrite)
                  for i, rep in enumerate(representations(cfg))}
        clusters = clusters_table(data.resolved, set(data.names()))
        data_record = {
            "command": command, "target": data.target.name, "target_train": len(data.target_train),
            "target_val": len(data.target_val), "target_preview": len(data.target_item.examples),
            "candidates": len(data.items), "warnings": data.warnings} | data.summary_fields()
        if clusters is not None:
            sizes = [len(g.examples) for g in data.resolved if g.members is not None]
            data_record["clusters"] = {"groups": len(sizes), "examples": sum(sizes), "smallest": min(sizes),
                                       "largest": max(sizes), "pools_reusing_embeddings": embed.hits}
        start = StartRecord(config=cfg.to_dict(), packages=package_versions(), data=data_record, model={
            "source": cfg.model.source, "revision": cfg.model.revision, "commit": resolved.commit,
            "dir": str(model_dir), "digest": digest})
        record.begin(assemble([start, EndRecord(status="running")]))  # a killed command does not look finished
        ctx = RunContext(cfg=cfg, tokenizer=tokenizer, data=data, costs=costs, record=record, stores=stores,
                         session=session, timer=timer, records=[start], runners=runners, train_spec=train_spec)
        end = EndRecord(status="complete")
        refresh = LiveProgress(lambda: session.progress.snapshot(timeout=5, quiet=True) if session.progress else None,
                               lambda stages: record.begin(assemble([start, EndRecord("running", progress=stages)])),
                               live)
        try:
            with refresh:  # stopped before the final summary below
                if embed is not None:
                    embed.save(lambda X, path: write_npy(X, path.parent, path.name))  # a cache, not a result
                if clusters is not None:  # a flat pool's clusters: which example went where (before featurisation)
                    record.write_parquet("clusters.parquet", clusters)
                record.write_parquet("examples.parquet",
                                     examples_table(data.target, data.candidates, target_key=TARGET_KEY))
                if not session.connected:  # a flat pool connected before the data stage
                    with timer.stage("ray_init"):
                        session.up()
                ctx.add(AttemptRecord(attempt=session.progress.attempt))  # the metrics' `attempt` tag
                ctx.replica = ReplicaSpec.from_config(cfg, model_dir, tokenizer.pad_token_id, digest)
                body(ctx)
        except BaseException as exc:
            error, signal_name = f"{type(exc).__name__}: {exc}", None
            if (stopped := signals.received()) is not None:
                signal_name, error = stopped.name, f"Interrupted: {stopped}"
            in_finetunes = ctx.stage in ctx.finetune_stages
            finished = ctx.outcome.finished if in_finetunes and ctx.outcome.finished else None
            end = EndRecord(status="failed", failed_stage=ctx.stage, error=error, signal=signal_name,
                            finetune_finished=finished,  # finished fine-tunes are kept in finetunes/ for a rerun
                            finetune_tuning=ctx.outcome.tuning if in_finetunes else None)
            raise
        finally:
            refresh.stop()  # again: a signal between the body and here must not let a running summary follow
            snap = session.progress.snapshot() if session.progress is not None else None
            end = dataclasses.replace(end, timings_s=timer.seconds | {"total": round(time.perf_counter() - t_start, 3)},
                                      progress=snap["stages"] if snap is not None else None,  # how far each got
                                      recovered=ctx.recovered())
            summary = assemble(ctx.records + [end])
            write_view(record, record.finish(summary))
    return summary
