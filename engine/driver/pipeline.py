"""The driver: one valuation run on Ray (model -> data -> featurise -> Gram -> KMM -> select -> bootstrap ->
fine-tune), each stage a function with a typed result, the run folder's summary.json kept true throughout."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from convalue.actors.embedder import embed_on_workers
from convalue.actors.evaluation import EvaluationRequest, FinetuneOutcome, Runners
from convalue.actors.solver import bootstrap_on_actors, evaluate_on_actor, path_on_actor
from convalue.engine.config import RunConfig
from convalue.engine.data.clustering import EmbeddingCache
from convalue.engine.data.costs import load_costs
from convalue.engine.data.prepare import TARGET_KEY, prepare
from convalue.engine.driver import signals
from convalue.engine.driver.baselines import fitted_baselines
from convalue.engine.driver.featurize import fingerprint
from convalue.engine.driver.session import (
    RaySession,
    Timer,
    check_reachable,
    cluster_address,
)
from convalue.engine.driver.stages import (
    TAGS,
    Valuation,
    check_budgets,
    representation_config,
    value,
    vector_folder,
)
from convalue.engine.model.digest import model_digest
from convalue.engine.model.loading import check_lora_targets_in, load_tokenizer, resolve_model
from convalue.engine.model.spec import ReplicaSpec
from convalue.engine.protocol.evaluate import BASELINE_METHODS, given_weights, method_scores
from convalue.engine.report.html import write_report
from convalue.engine.report.plots import plot_evaluation, plot_path, plot_scores
from convalue.engine.report.summary import RunSummary, SolverRecord
from convalue.engine.report.tables import (
    clusters_table,
    evaluation_table,
    examples_table,
    format_ranking,
    package_versions,
    scores_table,
    write_npy,
    write_parquet,
)
from convalue.engine.selection.blocked import GramResult
from convalue.engine.selection.bootstrap import outputs as bootstrap_outputs
from convalue.engine.selection.select import select_top_k
from convalue.engine.selection.solve import SolveSpec
from convalue.engine.store.folder import RunFolder
from convalue.engine.store.locks import run_folder_lock
from convalue.engine.store.vectors import VectorStore

log = logging.getLogger("convalue")
RESULT_FILES = ("scores.parquet", "path.parquet", "path.png", "gram.npy", "beta.npy", "costs.npy", "clusters.parquet", "examples.parquet",
                "bootstrap.parquet", "evaluation.parquet", "scores.png", "evaluation.png", "report.html",
                "summary.json",
                # the analysis commands' results and the K and beta of a run's other representations
                "faithfulness.parquet", "faithfulness.png", "transfer.parquet", "transfer.png",
                *(f"{kind}-{tag}.npy" for tag in TAGS.values() for kind in ("gram", "beta")))








def deepspeed_job_spec(cfg: RunConfig, model_dir: Path, digest: str):
    """The DeepSpeed fine-tune job spec (engine.protocol.deepspeed.TrainJobSpec) of finetune.strategy
    `deepspeed`, with finetune.model resolved, its LoRA targets checked and its content hashed; None otherwise."""
    if not (cfg.finetune.enabled and cfg.finetune.strategy == "deepspeed"):
        return None
    import dataclasses

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


def run(cfg: RunConfig, *, address: str | None = None, overwrite: bool = False,
        runners: Runners | None = None) -> RunSummary:
    """Run the whole valuation; returns the summary (also written to <out>/<name>/summary.json). runners: the
    fine-tune tasks (the default ones; tests inject failing ones)."""
    joined = cluster_address(cfg, address)
    if joined:
        import ray

        if not ray.is_initialized():
            check_reachable(*joined)  # before the model and data stages, not after them
    session = RaySession(cfg, joined[0] if joined else None)
    try:
        return _run(cfg, overwrite, session, runners or Runners())
    finally:
        session.close()








def _run(cfg: RunConfig, overwrite: bool, session: RaySession, runners: Runners) -> RunSummary:
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
        train_spec = deepspeed_job_spec(cfg, model_dir, digest)
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
        check_budgets(cfg, len(data.names()))
        costs = load_costs(cfg.solver.costs_file, data.names()) if cfg.solver.costs_file else None
        given = None  # `mixture: given`: every candidate's weight, checked before the hours of featurisation
        if cfg.finetune.enabled and cfg.finetune.mixture_weights is not None:
            given = given_weights(cfg.finetune.mixture_weights, data.names(), cfg.finetune.mixture_default_weight)
    run_dir.makedirs()
    with run_folder_lock(run_dir):  # no other run or re-solve writes here meanwhile
        reps = cfg.features.representations or [cfg.features.representation]
        # every representation's store opened (its settings checked) before anything of an earlier run is removed
        stores = {rep: VectorStore(vector_folder(run_dir, rep, i == 0),
                                   fingerprint(representation_config(cfg, rep), digest), overwrite=overwrite)
                  for i, rep in enumerate(reps)}
        store = stores[reps[0]]
        for f in RESULT_FILES:  # results of an earlier run in this folder are replaced, never mixed
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
            "target": data.target.name, "target_train": len(data.target_train), "target_val": len(data.target_val),
            "target_preview": len(data.target_item.examples), "candidates": len(data.items),
            "warnings": data.warnings})
        if clusters is not None:
            sizes = [len(g.examples) for g in data.resolved if g.members is not None]
            summary.data["clusters"] = {"groups": len(sizes), "examples": sum(sizes), "smallest": min(sizes),
                                        "largest": max(sizes), "pools_reusing_embeddings": embed.hits}
        summary.write(run_dir)  # "running" until the end: a killed run does not look finished
        stage = "ray_init"
        outcome = FinetuneOutcome()  # the fine-tunes done so far, listed in a failed summary
        try:
            if not session.connected:  # a flat pool connected before the data stage
                with timer.stage("ray_init"):
                    session.up()
            summary.attempt = session.progress.attempt  # the metrics' `attempt` tag
            replica = ReplicaSpec.from_config(cfg, model_dir, tokenizer.pad_token_id, digest)
            valued: list[Valuation] = []

            def on_stage(name: str) -> None:  # the stage a failure is recorded in
                nonlocal stage
                stage = name

            for i, rep in enumerate(reps):
                valued.append(value(cfg, rep, data, stores[rep], replica, tokenizer, costs, session.progress, timer,
                                    primary=i == 0, on_stage=on_stage))
                if i == 0:
                    summary.featurize = valued[0].features.stats.to_dict()
                    summary.gram = {k: v for k, v in valued[0].gram.stats.items() if k != "tile_detail"}
                else:
                    summary.representations = (summary.representations or {}) | {rep: valued[-1].record()}
            main = valued[0]
            names, gram, spec, sol = main.features.names, main.gram, main.spec, main.sol
            if gram.M is not None:
                summary.metric = {"kind": cfg.features.metric, "support": int(np.count_nonzero(gram.M)),
                                  "max_over_mean": round(float(gram.M.max()), 3)}
            summary.order, summary.space = names, spec.space  # the row order of gram.npy / beta.npy
            summary.solver = SolverRecord.from_solution(sol, spec.normalize, spec.rank_bound)
            if cfg.solver.gamma_ratio is not None:
                summary.solver.info["gamma_ratio"] = cfg.solver.gamma_ratio
            w, beta = sol.w, gram.beta
            selected = select_top_k(w, beta, cfg.select.k)
            bought = None
            if cfg.solver.path and gram.K is not None:
                with timer.stage("path"):
                    bought = {"kmm_path": regularisation_path(cfg, gram, spec, names, run_dir, summary)}
            boot = None
            if cfg.bootstrap.samples:
                stage = "bootstrap"
                with timer.stage("bootstrap"):
                    boot, summary.bootstrap = _bootstrap(cfg, spec, store, names, w, beta, selected,
                                                         session.progress)
            cos = gram.cosine
            table = scores_table(names, [len(g.examples) for g in data.candidates],
                                 [len(it.examples) for it in data.items], w, beta, cos, selected)
            plot_scores(table, run_dir, "scores.png")  # first: a figure that fails leaves no scores behind
            if gram.K is not None:
                write_npy(gram.K, run_dir, "gram.npy")
            write_npy(beta, run_dir, "beta.npy")
            if costs is not None:
                write_npy(costs, run_dir, "costs.npy")
            write_parquet(table, run_dir, "scores.parquet")
            if boot is not None:
                write_parquet(boot, run_dir, "bootstrap.parquet")
            summary.selected = [names[i] for i in selected]
            summary.ranking = format_ranking(table).splitlines()
            stage = "finetune"
            if cfg.finetune.enabled:
                with timer.stage("finetune"):
                    request = EvaluationRequest(cfg=cfg, spec=replica, tokenizer=tokenizer, data=data, names=names,
                                                scores={}, beta=beta, given=given, run_dir=run_dir,
                                                train_spec=train_spec, runners=runners, bought=bought)
                    fitted, cost = fitted_baselines(cfg, request, session.progress, outcome)
                    extra = representation_methods(valued) | fitted
                    methods = (["kmm"] + [b for b in cfg.finetune.baselines if b in BASELINE_METHODS]
                               + [m for m in extra if m not in cfg.finetune.baselines] + list(fitted))
                    scores = {s: method_scores(methods, w, beta, cos, cfg.finetune.random_order_seed(s), extra)
                              for s in cfg.finetune.seeds()}
                    evaluate_on_actor(dataclasses.replace(request, scores=scores), session.progress, outcome)
                    outcome.evaluation["cost"] = cost_record(summary, timer, valued) | cost
                plot_evaluation(outcome.rows, outcome.evaluation, run_dir, "evaluation.png")
                write_parquet(evaluation_table(outcome.rows), run_dir, "evaluation.parquet")
                summary.evaluation = outcome.evaluation
            summary.finetune = outcome.rows
            summary.status = "complete"
        except BaseException as exc:
            summary.status = "failed"
            summary.failed_stage = stage
            if stage == "finetune" and outcome.finished:  # kept in finetunes/ too, so a rerun trains only the rest
                summary.finetune_finished = outcome.finished
            summary.error = f"{type(exc).__name__}: {exc}"
            if (stopped := signals.received()) is not None:
                summary.signal, summary.error = stopped.name, f"Interrupted: {stopped}"
            raise
        finally:
            summary.timings_s = timer.seconds | {"total": round(time.perf_counter() - t_start, 3)}
            if session.progress is not None and (snap := session.progress.snapshot()) is not None:
                summary.progress = snap["stages"]  # how far each stage got: of interest when one failed
            summary.recovered = _recovered(session, store)
            summary.write(run_dir)
            try:
                write_report(run_dir)  # the page a person opens; a failure here never hides the run's own
            except Exception as exc:
                log.warning("report.html not written: %s", exc)
    return summary


def regularisation_path(cfg: RunConfig, gram: GramResult, spec: SolveSpec, names: list[str], run_dir: RunFolder,
                        summary: RunSummary) -> dict[int, list[int]]:
    """The whole gamma path on a solver actor: path.parquet (gamma, group, w), path.png, summary.json's `path`;
    returns what it buys at each evaluated k."""
    path = path_on_actor(gram.K, gram.beta, spec.normalize, cfg.solver.path_points)
    n = len(names)
    write_parquet(pa.table({"gamma": np.repeat(path.gammas, n), "group": names * len(path.gammas),
                            "score": path.W.reshape(-1)}), run_dir, "path.parquet")
    plot_path(path.gammas, path.W, names, run_dir, "path.png")
    ks = cfg.evaluation_ks()
    chosen = path.selections(ks)
    summary.path = {"points": len(path.gammas), "gamma_max": float(path.gammas[0]),
                    "gamma_min": float(path.gammas[-1]), "max_kkt": float(np.max(path.kkt)),
                    "seconds": round(path.time_s, 3), "bought": {str(k): [names[i] for i in chosen[k]] for k in ks}}
    return chosen


def cost_record(summary: RunSummary, timer: Timer, valued: list[Valuation]) -> dict[str, dict]:
    """What each gradient method cost: tokens featurised and the seconds of its featurise, Gram and solve stages
    (no fine-tune: the paper's point against DataModel)."""
    out = {}
    for v in valued:
        suffix = "" if v is valued[0] else f":{v.tag}"
        seconds = sum(timer.seconds.get(f"{s}{suffix}", 0.0) for s in ("featurize", "gram", "solve"))
        name = "kmm" if v is valued[0] else f"{v.tag}+kmm"
        out[name] = {"fine_tunes": 0, "tokens": v.features.stats.tokens, "seconds": round(seconds, 3)}
    return out


def representation_methods(valued: list[Valuation]) -> dict[str, np.ndarray]:
    """With several representations, each one's cosine ranking and KMM scores as methods (`one_step`,
    `one_step+kmm`, `tv`, `tv+kmm`, ...; the first's KMM is `kmm` itself); none with one representation."""
    if len(valued) < 2:
        return {}
    out = {valued[0].tag: valued[0].gram.cosine}
    for v in valued[1:]:
        out[v.tag] = v.gram.cosine
        out[f"{v.tag}+kmm"] = v.sol.w
    return out


def _recovered(session: RaySession, store: VectorStore) -> dict | None:
    """What the run survived, logged: work items retried and workers restarted (per stage), and damaged vector
    blocks set aside and computed again; None when nothing happened."""
    out = session.progress.recovery() if session.progress is not None else {}
    for stage, r in out.items():
        log.warning("%s: %d work item(s) ran again after a failure (%s), %d worker restart(s); results are complete",
                    stage, r["retries"], ", ".join(r["retried"][:5]) or "-", r["worker_restarts"])
    if store.dropped:
        out["vectors"] = {"blocks_set_aside": store.dropped}
    return out or None


def _bootstrap(cfg: RunConfig, spec: SolveSpec, store: VectorStore, names: list[str], w: np.ndarray,
               beta: np.ndarray, selected: list[int], progress) -> tuple[object, dict]:
    """Resample the previews bootstrap.samples times, spread over ray.workers solver actors; (bootstrap.parquet's
    table, summary). Each resample has its own seed, so the result does not depend on the spread."""
    progress.total("bootstrap", cfg.bootstrap.samples)
    W, S = bootstrap_on_actors(store.load_examples(names + [TARGET_KEY]), names, spec, cfg.select.k,
                               cfg.bootstrap.samples, cfg.bootstrap.seed, cfg.ray.workers, cfg.ray.cpus_per_worker,
                               on_part=lambda count: progress.advance("bootstrap", count))
    table, stats = bootstrap_outputs(names, w, beta, selected, W, S, cfg.bootstrap.seed)
    log.info("bootstrap: %d resamples of the previews; the selection came out again in %.0f %% of them",
             len(W), 100 * stats["same_selection"])
    return table, stats
