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

from convalue.actors.embedder import embed_on_workers
from convalue.actors.evaluation import FinetuneOutcome, Runners
from convalue.engine.config import RunConfig
from convalue.engine.data.clustering import EmbeddingCache
from convalue.engine.data.costs import load_costs
from convalue.engine.data.prepare import TARGET_KEY, PreparedData, prepare
from convalue.engine.driver import signals
from convalue.engine.driver.featurize import fingerprint
from convalue.engine.driver.session import RaySession, Timer, check_reachable, cluster_address
from convalue.engine.driver.stages import (
    TAGS,
    Valuation,
    make_run_folder,
    representation_config,
    value,
    vector_folder,
)
from convalue.engine.files.folder import RunFolder
from convalue.engine.files.locks import run_folder_lock
from convalue.engine.model.digest import model_digest
from convalue.engine.model.loading import check_lora_targets_in, load_tokenizer, resolve_model
from convalue.engine.model.spec import ReplicaSpec
from convalue.engine.report.html import write_report
from convalue.engine.report.plots import plot_scores
from convalue.engine.report.tables import (
    clusters_table,
    examples_table,
    format_ranking,
    scores_table,
)
from convalue.engine.selection.select import select_top_k
from convalue.engine.store.artifacts import package_versions, write_npy, write_parquet
from convalue.engine.store.summary import RunSummary, SolverRecord
from convalue.engine.store.vectors import VectorStore

log = logging.getLogger("convalue")
RESULT_FILES = ("scores.parquet", "path.parquet", "path.png", "gram.npy", "beta.npy", "costs.npy", "clusters.parquet",
                "examples.parquet", "bootstrap.parquet", "evaluation.parquet", "scores.png", "evaluation.png",
                "report.html", "summary.json",
                # the analysis commands' results and the K and beta of a run's other representations
                "faithfulness.parquet", "faithfulness.png", "transfer.parquet", "transfer.png",
                *(f"{kind}-{tag}.npy" for tag in TAGS.values() for kind in ("gram", "beta")))


def representations(cfg: RunConfig) -> list[str]:
    """The run's representations in order (features.representations, or features.representation alone)."""
    return list(cfg.features.representations or [cfg.features.representation])


def deepspeed_job_spec(cfg: RunConfig, model_dir: Path, digest: str):
    """The DeepSpeed fine-tune job spec (engine.protocol.deepspeed.TrainJobSpec) of finetune.strategy
    `deepspeed`, with finetune.model resolved, its LoRA targets checked and its content hashed; None otherwise."""
    if not (cfg.finetune.enabled and cfg.finetune.strategy == "deepspeed"):
        return None
    from convalue.engine.protocol.deepspeed import TrainJobSpec, ZeroSettings

    ft_dir, ft_digest = model_dir, digest
    if cfg.finetune.model is not None:
        ft_dir = resolve_model(dataclasses.replace(cfg.model, source=cfg.finetune.model, revision="main")).dir
        ft_digest = model_digest(ft_dir, Path(cfg.model.cache_dir).expanduser() / "digests")
        check_lora_targets_in(ft_dir, cfg.lora)
    return TrainJobSpec(str(ft_dir), cfg.finetune.dtype or cfg.model.dtype, cfg.model.max_length, cfg.finetune,
                        cfg.lora, ZeroSettings.from_config(cfg.finetune.deepspeed), cfg.finetune.deepspeed.cpus_per_worker,
                        ft_digest)


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
    run_dir: RunFolder
    stores: dict[str, VectorStore]
    session: RaySession
    timer: Timer
    summary: RunSummary
    runners: Runners
    train_spec: Any
    replica: ReplicaSpec | None = None
    stage: str = "ray_init"
    outcome: FinetuneOutcome = field(default_factory=FinetuneOutcome)
    finetune_stages: set[str] = field(default_factory=set)  # stages whose finished fine-tunes a failure lists

    def on_stage(self, name: str) -> None:
        """Record the stage a failure would be reported in."""
        self.stage = name

    def value(self, reps: list[str]) -> list[Valuation]:
        """Featurise, Gram and solve each representation (the first the primary: summary.json's featurize, gram
        and solver; the others under `representations`)."""
        valued = []
        for i, rep in enumerate(reps):
            v = value(self.cfg, rep, self.data, self.stores[rep], self.replica, self.tokenizer, self.costs,
                      self.session.progress, self.timer, primary=i == 0, on_stage=self.on_stage)
            valued.append(v)
            if i == 0:
                self.summary.featurize = v.features.stats.to_dict()
                self.summary.gram = {k: x for k, x in v.gram.stats.items() if k != "tile_detail"}
            else:
                self.summary.representations = (self.summary.representations or {}) | {rep: v.record()}
        return valued

    def record_solution(self, valued: list[Valuation]) -> None:
        """The primary valuation's row order, space, metric and solver certificate in the summary (kept by a run
        that fails later)."""
        main, summary = valued[0], self.summary
        if main.gram.M is not None:
            summary.metric = {"kind": self.cfg.features.metric, "support": int(np.count_nonzero(main.gram.M)),
                              "max_over_mean": round(float(main.gram.M.max()), 3)}
        summary.order, summary.space = main.features.names, main.spec.space  # the row order of gram.npy, beta.npy
        summary.solver = SolverRecord.from_solution(main.sol, main.spec.normalize, main.spec.rank_bound)
        if self.cfg.solver.gamma_ratio is not None:
            summary.solver.info["gamma_ratio"] = self.cfg.solver.gamma_ratio

    def selection(self, valued: list[Valuation]) -> list[int]:
        """The primary valuation's top select.k candidates (their rows in its order)."""
        main = valued[0]
        return select_top_k(main.sol.w, main.gram.beta, min(self.cfg.select.k, len(main.features.names)))

    def write_valuation(self, valued: list[Valuation]) -> None:
        """The primary representation's valuation as a run writes it (scores.png first: a figure that fails leaves
        no scores behind; gram.npy, beta.npy, costs.npy, scores.parquet; order, solver, selection and ranking in the
        summary), and the others' K and beta as gram-<tag>.npy and beta-<tag>.npy."""
        main, data = valued[0], self.data
        self.record_solution(valued)
        selected = self.selection(valued)
        table = scores_table(main.features.names, [len(g.examples) for g in data.candidates],
                             [len(it.examples) for it in data.items], main.sol.w, main.gram.beta, main.gram.cosine,
                             selected)
        plot_scores(table, self.run_dir, "scores.png")
        arrays = {}
        for v in valued:
            suffix = "" if v is main else f"-{v.tag}"
            if v.gram.K is not None:
                arrays[f"gram{suffix}.npy"] = v.gram.K
            arrays[f"beta{suffix}.npy"] = v.gram.beta
        if self.costs is not None:
            arrays["costs.npy"] = self.costs
        self.summary.checksums = {name: write_npy(a, self.run_dir, name) for name, a in arrays.items()}
        write_parquet(table, self.run_dir, "scores.parquet")
        self.summary.selected = [main.features.names[i] for i in selected]
        self.summary.ranking = format_ranking(table).splitlines()

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
            always_finetune: bool = False) -> RunSummary:
    """Run a command: precheck(cfg) before anything, check(cfg, data) after the data stage (both raise before any
    work), then body(ctx) with Ray up and the summary open; returns the summary (also <out>/<name>/summary.json).
    always_finetune: the command fine-tunes whatever finetune.enabled says (which switches a run's evaluation)."""
    precheck(cfg)
    joined = cluster_address(cfg, address)
    if joined:
        import ray

        if not ray.is_initialized():
            check_reachable(*joined)  # before the model and data stages, not after them
    session = RaySession(cfg, joined[0] if joined else None)
    try:
        return _execute(cfg, command, check, body, session, overwrite, runners or Runners(), always_finetune)
    finally:
        session.close()


def _execute(cfg: RunConfig, command: str, check: Callable[[RunConfig, PreparedData], None],
             body: Callable[[RunContext], None], session: RaySession, overwrite: bool, runners: Runners,
             always_finetune: bool) -> RunSummary:
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
        ft_cfg = dataclasses.replace(cfg, finetune=dataclasses.replace(cfg.finetune, enabled=True)) \
            if always_finetune else cfg
        train_spec = deepspeed_job_spec(ft_cfg, model_dir, digest)
    run_dir = RunFolder.at(cfg.out, cfg.name)
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
        costs = load_costs(cfg.solver.costs_file, data.names()) if cfg.solver.costs_file else None
    make_run_folder(run_dir, "out", cfg.out)
    with run_folder_lock(run_dir):  # no other run or re-solve writes here meanwhile
        reps = representations(cfg)
        # every representation's store opened (its settings checked) before anything of an earlier run is removed
        stores = {rep: VectorStore(vector_folder(run_dir, rep, i == 0),
                                   fingerprint(representation_config(cfg, rep), digest), overwrite=overwrite)
                  for i, rep in enumerate(reps)}
        for f in RESULT_FILES:  # an earlier run's or analysis's results are replaced, never mixed
            run_dir.delete(f)
        if embed is not None:
            embed.save(lambda X, path: write_npy(X, path.parent, path.name))
        clusters = clusters_table(data.resolved, set(data.names()))
        if clusters is not None:  # a flat pool's clusters: which example went where (before featurisation)
            write_parquet(clusters, run_dir, "clusters.parquet")
        write_parquet(examples_table(data.target, data.candidates, target_key=TARGET_KEY), run_dir, "examples.parquet")
        summary = RunSummary(status="running", config=cfg.to_dict(), packages=package_versions(),
                             model={"source": cfg.model.source, "revision": cfg.model.revision,
                                    "commit": resolved.commit, "dir": str(model_dir), "digest": digest}, data={
            "command": command, "target": data.target.name, "target_train": len(data.target_train),
            "target_val": len(data.target_val), "target_preview": len(data.target_item.examples),
            "candidates": len(data.items), "warnings": data.warnings})
        if clusters is not None:
            sizes = [len(g.examples) for g in data.resolved if g.members is not None]
            summary.data["clusters"] = {"groups": len(sizes), "examples": sum(sizes), "smallest": min(sizes),
                                        "largest": max(sizes), "pools_reusing_embeddings": embed.hits}
        summary.write(run_dir)  # "running" until the end: a killed command does not look finished
        ctx = RunContext(cfg=cfg, tokenizer=tokenizer, data=data, costs=costs, run_dir=run_dir, stores=stores,
                         session=session, timer=timer, summary=summary, runners=runners, train_spec=train_spec)
        try:
            if not session.connected:  # a flat pool connected before the data stage
                with timer.stage("ray_init"):
                    session.up()
            summary.attempt = session.progress.attempt  # the metrics' `attempt` tag
            ctx.replica = ReplicaSpec.from_config(cfg, model_dir, tokenizer.pad_token_id, digest)
            body(ctx)
            summary.status = "complete"
        except BaseException as exc:
            summary.status = "failed"
            summary.failed_stage = ctx.stage
            if ctx.stage in ctx.finetune_stages and ctx.outcome.finished:  # kept in finetunes/ for a rerun
                summary.finetune_finished = ctx.outcome.finished
            summary.error = f"{type(exc).__name__}: {exc}"
            if (stopped := signals.received()) is not None:
                summary.signal, summary.error = stopped.name, f"Interrupted: {stopped}"
            raise
        finally:
            summary.timings_s = timer.seconds | {"total": round(time.perf_counter() - t_start, 3)}
            if session.progress is not None and (snap := session.progress.snapshot()) is not None:
                summary.progress = snap["stages"]  # how far each stage got: of interest when one failed
            summary.recovered = ctx.recovered()
            summary.write(run_dir)
            try:
                write_report(run_dir)  # the page a person opens; a failure here never hides the command's own
            except Exception as exc:
                log.warning("report.html not written: %s", exc)
    return summary
