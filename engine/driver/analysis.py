"""What the analysis commands (`convalue faithfulness`, `convalue transfer`) share with a run: the model and data
stages, the run folder with its vector stores and its lock, Ray, each representation valued through
stages.value, fine-tunes of target + S on a solver actor (every one the run folder holds reused), and summary.json
kept true throughout ("running" from the start, "failed" with the stage and the error, report.html at the end)."""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from convalue.actors.embedder import embed_on_workers
from convalue.actors.evaluation import EvaluationRequest, FinetuneOutcome, Runners
from convalue.actors.solver import subsets_on_actor
from convalue.engine.config import ConfigError, RunConfig
from convalue.engine.data.clustering import EmbeddingCache
from convalue.engine.data.costs import load_costs
from convalue.engine.data.examples import DataError
from convalue.engine.data.prepare import TARGET_KEY, PreparedData, prepare, target_splits
from convalue.engine.driver import signals
from convalue.engine.driver.featurize import FeaturizeResult, fingerprint
from convalue.engine.driver.pipeline import RESULT_FILES, deepspeed_job_spec, embedding_cache_dir
from convalue.engine.driver.session import RaySession, Timer, check_reachable, cluster_address
from convalue.engine.driver.stages import (
    Valuation,
    representation_config,
    solver_space,
    value,
    vector_folder,
)
from convalue.engine.model.digest import model_digest
from convalue.engine.model.loading import check_lora_targets_in, load_tokenizer, resolve_model
from convalue.engine.model.spec import ReplicaSpec
from convalue.engine.model.tokenize import tokenize_examples
from convalue.engine.report.html import write_report
from convalue.engine.report.plots import plot_scores
from convalue.engine.report.summary import RunSummary, SolverRecord
from convalue.engine.report.tables import (
    clusters_table,
    examples_table,
    format_ranking,
    package_versions,
    scores_table,
    write_npy,
    write_parquet,
)
from convalue.engine.selection.select import select_top_k
from convalue.engine.store.finetunes import FinetuneStore, job_settings, train_job_settings
from convalue.engine.store.folder import RunFolder
from convalue.engine.store.locks import run_folder_lock
from convalue.engine.store.vectors import VectorStore

log = logging.getLogger("convalue")

def representations(cfg: RunConfig) -> list[str]:
    """The run's representations in order (features.representations, or features.representation alone)."""
    return list(cfg.features.representations or [cfg.features.representation])


@dataclass
class SubsetRuns:
    """The fine-tunes of target + S for some subsets S (and target only): validation losses, each stored record
    (training losses included), and how many were trained now and how many read back from the run folder."""

    losses: dict[tuple[str, ...], float]  # by sorted subset
    target_only: float
    base: float | None
    records: dict[tuple[str, ...], dict | None]  # by sorted subset, () the target alone
    trained: int
    reused: int

    def record(self, groups: Sequence[str]) -> dict:
        """The run of target + groups as summary.json reports it: groups, validation loss, training losses."""
        key = tuple(sorted(groups))
        rec = self.records.get(key) or {}
        return {"groups": list(groups), "val_loss": self.target_only if not key else self.losses[key],
                "first_train_loss": rec.get("first_train_loss"), "train_loss": rec.get("last_train_loss"),
                "steps": rec.get("steps"), "aux_steps": rec.get("aux_steps")}


@dataclass(eq=False)
class Analysis:
    """One analysis command in flight: the run's config, model, data, folder, stores and Ray, its summary, and
    the stage a failure is recorded in."""

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
    finetune_stages: set[str] = field(default_factory=set)

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

    def write_valuation(self, valued: list[Valuation]) -> None:
        """The primary representation's valuation as a run writes it (scores.parquet, scores.png, gram.npy,
        beta.npy; order, solver, selection and ranking in the summary), and the others' K and beta as
        gram-<tag>.npy and beta-<tag>.npy."""
        main, data, summary = valued[0], self.data, self.summary
        names, gram, spec, sol = main.features.names, main.gram, main.spec, main.sol
        selected = select_top_k(sol.w, gram.beta, min(self.cfg.select.k, len(names)))
        table = scores_table(names, [len(g.examples) for g in data.candidates],
                             [len(it.examples) for it in data.items], sol.w, gram.beta, gram.cosine, selected)
        plot_scores(table, self.run_dir, "scores.png")
        for v in valued:
            suffix = "" if v is main else f"-{v.tag}"
            if v.gram.K is not None:
                write_npy(v.gram.K, self.run_dir, f"gram{suffix}.npy")
            write_npy(v.gram.beta, self.run_dir, f"beta{suffix}.npy")
        write_parquet(table, self.run_dir, "scores.parquet")
        if gram.M is not None:
            summary.metric = {"kind": self.cfg.features.metric, "support": int(np.count_nonzero(gram.M)),
                              "max_over_mean": round(float(gram.M.max()), 3)}
        summary.order, summary.space = names, spec.space
        summary.solver = SolverRecord.from_solution(sol, spec.normalize, spec.rank_bound)
        if self.cfg.solver.gamma_ratio is not None:
            summary.solver.info["gamma_ratio"] = self.cfg.solver.gamma_ratio
        summary.selected = [names[i] for i in selected]
        summary.ranking = format_ranking(table).splitlines()

    def fine_tune(self, subsets: list[tuple[str, ...]], stage: str, data: PreparedData | None = None) -> SubsetRuns:
        """Fine-tune target + S for every subset S and the target alone (data: another target's data, see
        retarget), on a solver actor; every fine-tune the run folder holds is read back, not trained."""
        data = data or self.data
        names = [g.name for g in data.candidates]
        request = EvaluationRequest(cfg=self.cfg, spec=self.replica, tokenizer=self.tokenizer, data=data,
                                    names=names, scores={}, beta=np.zeros(len(names)), given=None,
                                    run_dir=self.run_dir, train_spec=self.train_spec, runners=self.runners)
        wanted = list(dict.fromkeys([(), *(tuple(sorted(s)) for s in subsets)]))
        stored = self._records(request, wanted)
        held = sum(r is not None for r in stored.values())
        self.stage = stage
        self.finetune_stages.add(stage)
        losses, target_only, base = subsets_on_actor(request, subsets, self.session.progress, self.outcome, stage)
        records = self._records(request, wanted)
        return SubsetRuns(losses=losses, target_only=target_only, base=base, records=records,
                          trained=len(wanted) - held, reused=held)

    def _records(self, request: EvaluationRequest, subsets: list[tuple[str, ...]]) -> dict[tuple, dict | None]:
        """The stored record of each subset's fine-tune, as actors.evaluation.run_subsets keys it (finetune.seed,
        uniform draws, finetune.rho), or None where the run folder does not hold it."""
        spec = request.spec
        settings = job_settings(spec) if request.train_spec is None else train_job_settings(request.train_spec, spec)
        store = FinetuneStore(self.run_dir.sub("finetunes"), settings, request.data.target_train,
                              request.data.target_val)
        seed = self.cfg.finetune.seed
        return {s: store.get(store.job_key({n: request.usable(n) for n in s}, seed, None, None)) for s in subsets}


def retarget(data: PreparedData, name: str, cfg: RunConfig, tokenizer: Any) -> PreparedData:
    """The fine-tune data with candidate group `name` as the target (split and tokenised as a run splits its
    target) and the run's target among the candidates, for fine-tunes of another group than the run's target."""
    group = next(g for g in data.candidates if g.name == name)
    train, val = target_splits(group, cfg.data)
    max_length = cfg.model.max_length
    train_tok = [t for t in tokenize_examples(tokenizer, train, max_length) if t.n_response > 0]
    val_tok = [t for t in tokenize_examples(tokenizer, val, max_length) if t.n_response > 0]
    if not train_tok or not val_tok:
        raise DataError(f"group {name!r} has no response tokens in its {'train' if not train_tok else 'validation'} "
                        f"split after formatting and truncation to model.max_length={max_length}")
    others = [data.target] + [g for g in data.candidates if g.name != name]
    return dataclasses.replace(data, target=group, target_train=train_tok, target_val=val_tok, candidates=others)


def gather_vectors(features: FeaturizeResult) -> np.ndarray:
    """Every candidate's vector in the run's order (n x p, float64), gathered from the blocks by a task."""
    import ray

    from convalue.actors.gram import gather_rows
    from convalue.engine.selection.blocked import panels_of

    panels = panels_of(features.blocks)
    n = len(features.names)
    refs = [features.refs[b.file] for p in panels for b in p.blocks]
    return np.asarray(ray.get(gather_rows.remote(n, panels, *refs)), dtype=np.float64)


def require_gram_space(cfg: RunConfig, n: int, command: str) -> None:
    """Refuse a solve in gradient space (solver.space, or `auto` above its threshold): the command needs K."""
    if solver_space(cfg, n) == "gradients":
        raise ConfigError(f"`convalue {command}` needs the Gram matrix K of the {n} candidates: set solver.space "
                          "to `gram`", field="solver.space", value=cfg.solver.space)


def analyse(cfg: RunConfig, command: str, precheck: Callable[[RunConfig], None],
            check: Callable[[RunConfig, PreparedData], None], body: Callable[[Analysis], None], *,
            address: str | None = None, overwrite: bool = False, runners: Runners | None = None) -> RunSummary:
    """Run an analysis command: precheck(cfg) before anything, check(cfg, data) after the data stage (both raise
    ConfigError before any work), then body(analysis) with Ray up and the summary open; returns the summary
    (also <out>/<name>/summary.json)."""
    precheck(cfg)
    joined = cluster_address(cfg, address)
    if joined:
        import ray

        if not ray.is_initialized():
            check_reachable(*joined)
    session = RaySession(cfg, joined[0] if joined else None)
    try:
        return _analyse(cfg, command, check, body, session, overwrite, runners or Runners())
    finally:
        session.close()


def _analyse(cfg: RunConfig, command: str, check: Callable[[RunConfig, PreparedData], None],
             body: Callable[[Analysis], None], session: RaySession, overwrite: bool, runners: Runners) -> RunSummary:
    timer = Timer(lambda: session.progress)
    t_start = time.perf_counter()
    with timer.stage("model"):
        resolved = resolve_model(cfg.model)
        model_dir = resolved.dir
        digest = model_digest(model_dir, Path(cfg.model.cache_dir).expanduser() / "digests")
        tokenizer = load_tokenizer(model_dir)
        if cfg.features.parameters == "lora":
            check_lora_targets_in(model_dir, cfg.lora)
        # the analyses fine-tune whatever finetune.enabled says (it switches a run's evaluation on and off)
        train_spec = deepspeed_job_spec(dataclasses.replace(cfg, finetune=dataclasses.replace(
            cfg.finetune, enabled=True)), model_dir, digest)
    run_dir = RunFolder.at(cfg.out, cfg.name)
    embed = None
    if any(src.clusters is not None for src in cfg.data.candidates):
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
    run_dir.makedirs()
    with run_folder_lock(run_dir):
        reps = representations(cfg)
        stores = {rep: VectorStore(vector_folder(run_dir, rep, i == 0),
                                   fingerprint(representation_config(cfg, rep), digest), overwrite=overwrite)
                  for i, rep in enumerate(reps)}
        for f in RESULT_FILES:  # an earlier run's or analysis's results are replaced, not mixed
            run_dir.delete(f)
        if embed is not None:
            embed.save(lambda X, path: write_npy(X, path.parent, path.name))
        clusters = clusters_table(data.resolved, set(data.names()))
        if clusters is not None:
            write_parquet(clusters, run_dir, "clusters.parquet")
        write_parquet(examples_table(data.target, data.candidates, target_key=TARGET_KEY), run_dir, "examples.parquet")
        summary = RunSummary(status="running", config=cfg.to_dict(), packages=package_versions(),
                             model={"source": cfg.model.source, "revision": cfg.model.revision,
                                    "commit": resolved.commit, "dir": str(model_dir), "digest": digest}, data={
            "command": command, "target": data.target.name, "target_train": len(data.target_train),
            "target_val": len(data.target_val), "target_preview": len(data.target_item.examples),
            "candidates": len(data.items), "warnings": data.warnings})
        summary.write(run_dir)
        ctx = Analysis(cfg=cfg, tokenizer=tokenizer, data=data, costs=costs, run_dir=run_dir, stores=stores,
                       session=session, timer=timer, summary=summary, runners=runners, train_spec=train_spec)
        try:
            if not session.connected:
                with timer.stage("ray_init"):
                    session.up()
            summary.attempt = session.progress.attempt
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
                summary.progress = snap["stages"]
            recovered = session.progress.recovery() if session.progress is not None else {}
            if dropped := [b for s in stores.values() for b in s.dropped]:
                recovered["vectors"] = {"blocks_set_aside": dropped}
            summary.recovered = recovered or None
            summary.write(run_dir)
            try:
                write_report(run_dir)
            except Exception as exc:
                log.warning("report.html not written: %s", exc)
    return summary


def agreement_label(tag: str, surrogate: str) -> str:
    """A representation's surrogate as the paper names it: One-Step, One-Step+KMM, TV, TV+KMM."""
    name = {"one_step": "One-Step", "tv": "TV", "grpo": "GRPO"}.get(tag, tag)
    return name + ("+KMM" if surrogate == "kmm" else "")
