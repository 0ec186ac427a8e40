"""The fitted baselines of the evaluation (paper App. baselines): DataModel on uniform and compressed-sensing
designs — fine-tunes of random subsets dispatched by the solver actor, a LASSO fitted to their validation losses —
with what each cost, so a run's summary compares scores against the fine-tunes and time they took."""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np

from convalue.actors.evaluation import EvaluationRequest, FinetuneOutcome
from convalue.actors.solver import subsets_on_actor
from convalue.engine.config import RunConfig
from convalue.engine.protocol.datamodel import (
    cs_design,
    fit_datamodel,
    uniform_design,
    utilities_from_losses,
)

log = logging.getLogger("convalue")
FITTED = ("datamodel", "datamodel_cs")


def fitted_baselines(cfg: RunConfig, request: EvaluationRequest, progress: Any,
                     outcome: FinetuneOutcome) -> tuple[dict[str, np.ndarray], dict[str, dict]]:
    """({method: per-candidate scores}, {method: cost}) of the fitted baselines cfg.finetune.baselines asks for."""
    scores, cost = {}, {}
    dm, n = cfg.finetune.datamodel, len(request.names)
    for kind in [b for b in cfg.finetune.baselines if b in FITTED]:
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
