"""`convalue transfer CONFIG` (paper Fig. pairwise_relation and Tab. zh_results): every group of the pool, the
target included, valued as the target against all the others from one featurisation.

The run's first representation is featurised once (the target's vector is g_tar, the candidates' are in the
blocks); their vectors are gathered and engine.protocol.transfer.transfer_scores solves one KMM problem per row
(K of the others, beta their inner products with the row's group; transfer.gamma_ratio and transfer.normalize).
Writes transfer.parquet (target, source, score, signed rank), transfer.png (the signed scores as a clustered
heatmap) and the primary valuation as a run does. Then, unless transfer.check is false, the positive/negative
check for transfer.target: fine-tunes of it alone, with its positive set, and with its positive and negative
sets, their validation and training losses in summary.json's `evaluation.transfer`.
"""

from __future__ import annotations

import logging

import numpy as np
import pyarrow as pa

from convalue.actors.evaluation import Runners
from convalue.engine.config import ConfigError, RunConfig
from convalue.engine.data.prepare import PreparedData
from convalue.engine.driver.analysis import (
    fine_tune,
    gather_vectors,
    retarget,
)
from convalue.engine.driver.command import RunContext, execute, representations
from convalue.engine.protocol.transfer import (
    cluster_order,
    positive_negative,
    signed_ranks,
    transfer_scores,
)
from convalue.engine.report.analysis_plots import plot_transfer
from convalue.engine.store.stage_records import EvaluationRecord
from convalue.engine.store.summary import RunSummary

log = logging.getLogger("convalue")
STAGE = "transfer"
CHECK_STAGE = "transfer_check"
#: the check's fine-tunes as Tab. zh_results labels them
RUN_LABELS = {"target_only": "target only", "pos": "target + positive", "pos_neg": "target + positive + negative"}


def run_transfer(cfg: RunConfig, *, address: str | None = None, overwrite: bool = False,
                 runners: Runners | None = None) -> RunSummary:
    """The pairwise transfer study of the run's config; returns the summary (also <out>/<name>/summary.json)."""
    return execute(cfg, "transfer", _precheck, check, _body, address=address, overwrite=overwrite, runners=runners,
                   always_finetune=True)


def _precheck(cfg: RunConfig) -> None:
    if cfg.features.metric != "euclidean":  # each row is its own target: one metric cannot serve every row
        raise ConfigError("`convalue transfer` values every group as the target in turn, in the Euclidean metric "
                          "only (the diagonal Fisher metric treats the target apart)", field="features.metric",
                          value=cfg.features.metric)


def transfer_target(cfg: RunConfig, data: PreparedData) -> str:
    """transfer.target, or the run's target."""
    return cfg.transfer.target or data.target.name


def check(cfg: RunConfig, data: PreparedData) -> None:
    """Refuse, before any work, a transfer.target that is not a group of the pool (the data stage has refused a
    target that is also a candidate)."""
    groups = [data.target.name, *data.names()]
    if (t := transfer_target(cfg, data)) not in groups:
        shown = groups if len(groups) <= 30 else groups[:30] + ["..."]
        raise ConfigError(f"is not a group of the pool (the groups: {shown})", field="transfer.target", value=t)


def transfer_table(W: np.ndarray, R: np.ndarray, names: list[str]) -> pa.Table:
    """transfer.parquet: one row per (target, source) pair of different groups, its score and signed rank."""
    M = len(names)
    pairs = [(t, j) for t in range(M) for j in range(M) if j != t]
    return pa.table({"target": [names[t] for t, _ in pairs], "source": [names[j] for _, j in pairs],
                     "score": pa.array([float(W[t, j]) for t, j in pairs]),
                     "signed_rank": pa.array([int(R[t, j]) for t, j in pairs], pa.int32())})


def _body(ctx: RunContext) -> None:
    cfg, tc, data = ctx.cfg, ctx.cfg.transfer, ctx.data
    reps = representations(cfg)
    if len(reps) > 1:
        log.info("transfer: the matrix of the first representation, %s (of %s)", reps[0], reps)
    [v] = ctx.value(reps[:1])
    ctx.write_valuation([v])
    ctx.on_stage(STAGE)
    with ctx.timer.stage(STAGE):
        names = [data.target.name, *v.features.names]
        G = np.vstack([np.asarray(v.features.g_tar, np.float64)[None, :], gather_vectors(v.features)])
        W = transfer_scores(G, gamma_ratio=tc.gamma_ratio, normalize=tc.normalize)
        R = signed_ranks(W)
        order = cluster_order(W)
    ctx.on_stage("outputs")
    ctx.record.write_png("transfer.png", plot_transfer(W, R, names, order))
    ctx.record.write_parquet("transfer.parquet", transfer_table(W, R, names))
    target = transfer_target(cfg, data)
    pn = positive_negative(W, names, target, n_pos=tc.positive, n_neg=tc.negative)
    t = names.index(target)
    record = {"representation": v.representation, "groups": names, "order": [names[i] for i in order],
              "gamma_ratio": tc.gamma_ratio, "normalize": tc.normalize, "target": target,
              "positive": list(pn.positive), "negative": list(pn.negative),
              "row": {names[j]: float(W[t, j]) for j in range(len(names)) if j != t},
              "positive_scores": int(np.sum(W[t] > 0)), "negative_scores": int(np.sum(W[t] < 0))}
    ctx.add(EvaluationRecord(evaluation={STAGE: record}))  # the check's runs join this record below
    if not tc.check:
        return
    runs = pn.runs()
    fine_tune_data = data if target == data.target.name else retarget(data, target, cfg, ctx.tokenizer)
    with ctx.timer.stage(CHECK_STAGE):
        done = fine_tune(ctx, [g for label, g in runs.items() if g], CHECK_STAGE, fine_tune_data)
    record["runs"] = {label: done.record(groups) for label, groups in runs.items()}
    record["base_val_loss"] = done.base
    record["fine_tunes"] = {"trained": done.trained, "reused": done.reused}


def format_transfer(summary: RunSummary) -> str:
    """What `convalue transfer` prints: the target's row, its sets and (with the check) the Tab. zh_results
    losses."""
    r = (summary.evaluation or {}).get(STAGE) or {}
    row = r.get("row") or {}
    ranked = sorted(row.items(), key=lambda kv: -kv[1])
    lines = [f"transfer over {len(r.get('groups') or [])} groups ({r.get('representation')}, gamma_ratio "
             f"{r.get('gamma_ratio')}, {r.get('normalize')}); row of {r.get('target')}: "
             f"{r.get('positive_scores')} positive, {r.get('negative_scores')} negative",
             "  " + ", ".join(f"{g} {w:+.4f}" for g, w in ranked if w != 0) if ranked else "  (no other group)",
             f"positive set: {', '.join(r.get('positive') or []) or 'none'}",
             f"negative set: {', '.join(r.get('negative') or []) or 'none'}"]
    runs = r.get("runs")
    if runs:
        def loss(x: object) -> str:
            return f"{x:.4f}" if isinstance(x, (int, float)) else "-"

        base = r.get("base_val_loss")
        lines.append(f"fine-tunes on {r.get('target')} (validation loss; training loss at the last step):")
        lines.append(f"  {'base model':<30}  val {loss(base)}")
        ref = runs["target_only"]["val_loss"]
        for label, run in runs.items():
            delta = "" if label == "target_only" else f" ({run['val_loss'] - ref:+.3g})"
            lines.append(f"  {RUN_LABELS[label]:<30}  val {loss(run['val_loss'])}{delta}  train "
                         f"{loss(run.get('train_loss'))}")
        ft = r.get("fine_tunes") or {}
        lines.append(f"fine-tunes: {ft.get('trained', 0)} trained, {ft.get('reused', 0)} read back from the run "
                     "folder")
    return "\n".join(lines)
