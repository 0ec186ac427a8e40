"""The driver: one valuation run on Ray (model -> data -> featurise -> Gram -> KMM -> select -> bootstrap ->
fine-tune), each stage a function with a typed result, in the frame of engine.driver.command (the run folder, Ray
and summary.json kept true throughout)."""

from __future__ import annotations

import dataclasses
import logging

import numpy as np
import pyarrow as pa

from convalue.actors.evaluation import EvaluationRequest, Runners
from convalue.actors.solver import bootstrap_on_actors, evaluate_on_actor, path_on_actor
from convalue.engine.config import RunConfig
from convalue.engine.data.prepare import TARGET_KEY, PreparedData
from convalue.engine.driver.baselines import fitted_baselines
from convalue.engine.driver.checks import check_budgets
from convalue.engine.driver.command import RunContext, execute, representations
from convalue.engine.driver.stages import Valuation
from convalue.engine.driver.timer import Timer
from convalue.engine.protocol.evaluate import BASELINE_METHODS, given_weights, method_scores
from convalue.engine.protocol.verdict import not_evaluated
from convalue.engine.report.plots import plot_curves, plot_evaluation, plot_path
from convalue.engine.report.tables import evaluation_table
from convalue.engine.selection.blocked import GramResult
from convalue.engine.selection.bootstrap import outputs as bootstrap_outputs
from convalue.engine.selection.solve import SolveSpec
from convalue.engine.store.record import RunRecord
from convalue.engine.store.stage_records import BootstrapRecord, EvaluationRecord, PathRecord
from convalue.engine.store.summary import RunSummary
from convalue.engine.store.vectors import VectorStore

log = logging.getLogger("convalue")


def run(cfg: RunConfig, *, address: str | None = None, overwrite: bool = False,
        runners: Runners | None = None) -> RunSummary:
    """Run the whole valuation; returns the summary (also written to <out>/<name>/summary.json). runners: the
    fine-tune tasks (the default ones; tests inject failing ones)."""
    return execute(cfg, "run", lambda cfg: None, _check, _body, address=address, overwrite=overwrite,
                   runners=runners)


def _given(cfg: RunConfig, data: PreparedData) -> dict[str, float] | None:
    """`mixture: given`: every candidate's weight (None for the other mixtures)."""
    if cfg.finetune.enabled and cfg.finetune.mixture_weights is not None:
        return given_weights(cfg.finetune.mixture_weights, data.names(), cfg.finetune.mixture_default_weight)
    return None


def _check(cfg: RunConfig, data: PreparedData) -> None:
    """Budgets within the pool and the given mixture's weights, checked before the hours of featurisation."""
    check_budgets(cfg, len(data.names()))
    _given(cfg, data)


def _body(ctx: RunContext) -> None:
    cfg, timer, record = ctx.cfg, ctx.timer, ctx.record
    valued = ctx.value(representations(cfg))
    main = valued[0]
    names, gram, spec, sol = main.features.names, main.gram, main.spec, main.sol
    w, beta, selected = sol.w, gram.beta, ctx.selection(valued)
    bought = None
    if cfg.solver.path and gram.K is not None:
        with timer.stage("path"):
            path_record, chosen = regularisation_path(cfg, gram, spec, names, record)
            ctx.add(path_record)
            bought = {"kmm_path": chosen}
    boot = None
    if cfg.bootstrap.samples:
        ctx.on_stage("bootstrap")
        with timer.stage("bootstrap"):
            boot, stats = _bootstrap(cfg, spec, main.store, names, w, beta, selected, ctx.session.progress)
            ctx.add(BootstrapRecord(bootstrap=stats))
    ctx.write_valuation(valued)
    if boot is not None:
        record.write_parquet("bootstrap.parquet", boot)
    ctx.on_stage("finetune")
    ctx.finetune_stages.add("finetune")
    if not cfg.finetune.enabled:  # the ranking stands alone, and the summary says so
        ctx.add(EvaluationRecord(evaluation={"verdict": not_evaluated().to_dict()}))
        return
    outcome = ctx.outcome
    with timer.stage("finetune"):
        request = EvaluationRequest(cfg=cfg, spec=ctx.replica, tokenizer=ctx.tokenizer, data=ctx.data,
                                    names=names, scores={}, beta=beta, given=_given(cfg, ctx.data),
                                    run_dir=ctx.run_dir, train_spec=ctx.train_spec, runners=ctx.runners,
                                    bought=bought)
        fitted, cost = fitted_baselines(cfg, request, ctx.session.progress, outcome)
        extra = representation_methods(valued) | fitted
        methods = (["kmm"] + [b for b in cfg.finetune.baselines if b in BASELINE_METHODS]
                   + [m for m in extra if m not in cfg.finetune.baselines] + list(fitted))
        scores = {s: method_scores(methods, w, beta, gram.cosine, cfg.finetune.random_order_seed(s), extra)
                  for s in cfg.finetune.seeds() + cfg.finetune.tuning_seeds()}
        evaluate_on_actor(dataclasses.replace(request, scores=scores), ctx.session.progress, outcome)
        outcome.evaluation["cost"] = cost_record(timer, valued) | cost
    record.write_png("evaluation.png", plot_evaluation(outcome.rows, outcome.evaluation))
    if outcome.evaluation.get("curves"):
        record.write_png("curves.png", plot_curves(outcome.evaluation))
    record.write_parquet("evaluation.parquet", evaluation_table(outcome.rows))
    ctx.add(EvaluationRecord(evaluation=outcome.evaluation, finetune=outcome.rows))


def regularisation_path(cfg: RunConfig, gram: GramResult, spec: SolveSpec, names: list[str],
                        record: RunRecord) -> tuple[PathRecord, dict[int, list[int]]]:
    """The whole gamma path on a solver actor: path.parquet (gamma, group, w), path.png and summary.json's `path`;
    with what it buys at each evaluated k."""
    path = path_on_actor(gram.K, gram.beta, spec.normalize, cfg.solver.path_points)
    n = len(names)
    record.write_parquet("path.parquet", pa.table({"gamma": np.repeat(path.gammas, n), "group": names * len(path.gammas),
                                                   "score": path.W.reshape(-1)}))
    record.write_png("path.png", plot_path(path.gammas, path.W, names))
    ks = cfg.evaluation_ks()
    chosen = path.selections(ks)
    return PathRecord(path={
        "points": len(path.gammas), "gamma_max": float(path.gammas[0]), "gamma_min": float(path.gammas[-1]),
        "max_kkt": float(np.max(path.kkt)), "seconds": round(path.time_s, 3),
        "bought": {str(k): [names[i] for i in chosen[k]] for k in ks}}), chosen


def cost_record(timer: Timer, valued: list[Valuation]) -> dict[str, dict]:
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
