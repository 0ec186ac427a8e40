"""The fitted baselines of the evaluation (paper App. baselines), with what each cost, so a run's summary compares
scores against the fine-tunes and time they took: DataModel on uniform and compressed-sensing designs (fine-tunes
of random subsets dispatched by the solver actor, a LASSO fitted to their validation losses) and GradEx (one
multitask fine-tune theta*, per-example log-odds gradients there, a logistic surrogate: forward selection or a
random ensemble)."""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np
import ray

from convalue.actors.evaluation import EvaluationRequest, FinetuneOutcome
from convalue.actors.finetune_job import log_odds_task, theta_star_task
from convalue.actors.pool import windowed
from convalue.actors.solver import subsets_on_actor
from convalue.engine.config import ConfigError, RunConfig
from convalue.engine.protocol.datamodel import (
    cs_design,
    fit_datamodel,
    uniform_design,
    utilities_from_losses,
)
from convalue.engine.protocol.gradex import (
    GradEx,
    LinearisedSet,
    ensemble_subsets,
    forward_selection,
    random_ensemble,
)

log = logging.getLogger("convalue")
FITTED = ("datamodel", "datamodel_cs", "gradex_fs", "gradex_re")


def fitted_baselines(cfg: RunConfig, request: EvaluationRequest, progress: Any,
                     outcome: FinetuneOutcome) -> tuple[dict[str, np.ndarray], dict[str, dict]]:
    """({method: per-candidate scores}, {method: cost}) of the fitted baselines cfg.finetune.baselines asks for."""
    scores, cost = {}, {}
    dm, n = cfg.finetune.datamodel, len(request.names)
    gradex = [b for b in cfg.finetune.baselines if b.startswith("gradex_")]
    if gradex:
        scores_gx, cost_gx = _gradex(cfg, request, gradex)
        scores, cost = scores | scores_gx, cost | cost_gx
    for kind in [b for b in cfg.finetune.baselines if b.startswith("datamodel")]:
        t0 = time.perf_counter()
        if kind == "datamodel":
            design = uniform_design(n, rows=max(1, round(dm.runs_per_candidate * n)), rho=dm.rho, seed=dm.seed)
        else:  # two fine-tunes a row: the same budget in fine-tunes
            design = cs_design(n, rows=max(1, round(dm.runs_per_candidate * n / 2)), seed=dm.seed)
        subsets = [tuple(request.names[i] for i in s) for s in design.subsets]
        losses, target_only, _ = subsets_on_actor(request, subsets, progress, outcome, kind)
        u = utilities_from_losses(np.array([losses[tuple(sorted(s))] for s in subsets]), target_only)
        scores[kind] = fit_datamodel(design, u, alpha_ratio=dm.alpha_ratio)
        cost[kind] = {"fine_tunes": len(design.subsets) + 1, "design_rows": design.rows,
                      "seconds": round(time.perf_counter() - t0, 3)}
        log.info("%s: %d subset fine-tunes fitted in %.1f s; %d candidates scored above zero", kind,
                 len(design.subsets), cost[kind]["seconds"], int(np.sum(scores[kind] > 0)))
    return scores, cost


def _gradex(cfg: RunConfig, request: EvaluationRequest, kinds: list[str]) -> tuple[dict[str, np.ndarray], dict]:
    """GradEx-FS and GradEx-RE: theta* by one multitask fine-tune, then every target example's and every
    candidate preview's log-odds gradient at theta* (one task per candidate group), the surrogate on top."""
    if cfg.features.representation == "grpo":
        raise ConfigError("GradEx linearises the SFT log-odds: it needs SFT previews, not GRPO prompts",
                          field="finetune.baselines", value=kinds)
    t0, gx_cfg, data = time.perf_counter(), cfg.finetune.gradex, request.data
    opts = {"num_cpus": cfg.ray.cpus_per_worker, "num_gpus": cfg.ray.gpus_per_worker}
    spec = request.spec.for_job(cfg.finetune.seed)
    aux = {n: request.usable(n) for n in request.names}
    state = ray.put(ray.get(theta_star_task.options(**opts).remote(spec, data.target_train, aux, data.target_val)))
    sets = {"__train__": list(data.target_train), "__val__": list(data.target_val)} | {
        it.name: list(it.examples) for it in data.items}
    feats: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    payloads = [[name] for name in sets]  # one set per call
    for _, out in windowed([None], payloads, lambda _, b: log_odds_task.options(**opts).remote(
            spec, state, {b[0]: sets[b[0]]}, gx_cfg.projection_dim, gx_cfg.seed),
            max(1, cfg.ray.workers * cfg.ray.max_in_flight)):
        feats.update(out)
    model = GradEx(LinearisedSet(*feats["__train__"]), LinearisedSet(*feats["__val__"]),
                   [LinearisedSet(*feats[n]) for n in request.names], ridge=gx_cfg.ridge)
    n, prep = len(request.names), round(time.perf_counter() - t0, 3)
    base_cost = {"fine_tunes": 1, "gradient_examples": sum(len(v) for v in sets.values())}
    scores, cost = {}, {}
    if "gradex_fs" in kinds:
        t1 = time.perf_counter()
        scores["gradex_fs"] = forward_selection(model).scores
        cost["gradex_fs"] = base_cost | {"seconds": round(prep + time.perf_counter() - t1, 3)}
    if "gradex_re" in kinds:
        t1 = time.perf_counter()
        draws = max(1, round(gx_cfg.draws_per_candidate * n))
        scores["gradex_re"] = random_ensemble(model, ensemble_subsets(n, draws=draws, rho=gx_cfg.rho, seed=gx_cfg.seed))
        cost["gradex_re"] = base_cost | {"seconds": round(prep + time.perf_counter() - t1, 3), "draws": draws}
    log.info("GradEx: theta* and %d per-example gradients in %.1f s", base_cost["gradient_examples"], prep)
    return scores, cost
