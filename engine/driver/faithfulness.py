"""`convalue faithfulness CONFIG` (paper Tab. subset-faithfulness): do surrogate scores rank k-subsets of the
candidates as their fine-tunes do?

Each representation of the run (features.representations) is featurised once; every subset S of size
faithfulness.k of the chosen candidates (or a seeded sample) is fine-tuned on the target plus S under the
finetune section's fixed budget, beside the target alone; u_FT(S) = L_val(target only) - L_val(target + S). Each
representation's additive and KMM surrogates (engine.protocol.faithfulness) are compared with u_FT by Spearman's
rho, its p-value and the top overlap. Writes faithfulness.parquet, faithfulness.png, the primary representation's
scores (as a run does) and summary.json, whose `evaluation.faithfulness` holds the agreements.
"""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa

from convalue.actors.evaluation import Runners
from convalue.engine.config import ConfigError, RunConfig
from convalue.engine.data.prepare import PreparedData
from convalue.engine.driver.analysis import (
    agreement_label,
    fine_tune,
    require_gram_space,
)
from convalue.engine.driver.command import RunContext, execute, representations
from convalue.engine.driver.stages import Valuation
from convalue.engine.protocol.datamodel import utilities_from_losses
from convalue.engine.protocol.faithfulness import (
    cosine_inputs,
    enumerate_subsets,
    faithfulness,
    faithfulness_table,
)
from convalue.engine.report.analysis_plots import plot_faithfulness
from convalue.engine.store.stage_records import EvaluationRecord
from convalue.engine.store.summary import RunSummary

STAGE = "faithfulness"


def run_faithfulness(cfg: RunConfig, *, address: str | None = None, overwrite: bool = False,
                     runners: Runners | None = None) -> RunSummary:
    """The subset-faithfulness study of the run's config; returns the summary (also <out>/<name>/summary.json)."""
    return execute(cfg, "faithfulness", _precheck, check, _body, address=address, overwrite=overwrite, runners=runners,
                   always_finetune=True)


def _precheck(cfg: RunConfig) -> None:
    if cfg.solver.space == "gradients":  # before the model and data stages
        raise ConfigError("`convalue faithfulness` needs the Gram matrix K: set solver.space to `gram` or `auto`",
                          field="solver.space", value=cfg.solver.space)


def chosen_candidates(cfg: RunConfig, names: list[str]) -> list[str]:
    """The candidates whose subsets are enumerated: faithfulness.candidates (checked against the pool), or all."""
    fc = cfg.faithfulness
    if fc.candidates is None:
        return list(names)
    if unknown := [c for c in fc.candidates if c not in names]:
        shown = names if len(names) <= 30 else names[:30] + ["..."]
        raise ConfigError(f"names groups that are not candidates of the run: {unknown} (the candidates: {shown})",
                          field="faithfulness.candidates", value=fc.candidates)
    return list(fc.candidates)


def check(cfg: RunConfig, data: PreparedData) -> None:
    """Refuse, before any work, what the pool cannot give: unknown candidates, k larger than the candidates, fewer
    than 3 subsets, and a gradient-space solve (K is needed)."""
    names = data.names()
    chosen = chosen_candidates(cfg, names)
    fc = cfg.faithfulness
    if fc.k > len(chosen):
        raise ConfigError(f"is larger than the {len(chosen)} candidate group(s) whose subsets are enumerated",
                          field="faithfulness.k", value=fc.k)
    if (total := math.comb(len(chosen), fc.k)) < 3:
        raise ConfigError(f"gives C({len(chosen)}, {fc.k}) = {total} subset(s) of the candidates: a rank correlation "
                          "needs at least 3", field="faithfulness.k", value=fc.k)
    require_gram_space(cfg, len(names), "faithfulness")


def target_norm(v: Valuation) -> float:
    """||g_tar|| in the Gram's metric (with the diagonal Fisher M: the norm of g_tar / sqrt(M) on M's support)."""
    g = np.asarray(v.features.g_tar, dtype=np.float64)
    M = v.gram.M
    if M is None:
        return float(np.linalg.norm(g))
    return float(np.sqrt(np.sum(np.divide(g * g, M, out=np.zeros_like(g), where=M > 0))))


def surrogate_inputs(v: Valuation, positions: list[int], normalize: str) -> tuple[np.ndarray, np.ndarray]:
    """(K, beta) of the chosen candidates in one representation, of unit vectors with `cosine` (the paper's)."""
    K = v.gram.K[np.ix_(positions, positions)]
    beta = v.gram.beta[positions]
    return cosine_inputs(K, beta, target_norm(v)) if normalize == "cosine" else (K, beta)


def _body(ctx: RunContext) -> None:
    cfg, fc = ctx.cfg, ctx.cfg.faithfulness
    valued = ctx.value(representations(cfg))
    ctx.write_valuation(valued)
    names = valued[0].features.names
    chosen = chosen_candidates(cfg, names)
    positions = [names.index(c) for c in chosen]
    index = enumerate_subsets(len(chosen), fc.k, sample=fc.sample, seed=fc.seed)
    subsets = [tuple(chosen[i] for i in s) for s in index]
    with ctx.timer.stage(STAGE):
        runs = fine_tune(ctx, subsets, STAGE)
    ctx.on_stage("outputs")
    losses = np.array([runs.losses[tuple(sorted(s))] for s in subsets])
    u_ft = utilities_from_losses(losses, runs.target_only)
    inputs = {v.tag: surrogate_inputs(v, positions, fc.normalize) for v in valued}
    agreements = faithfulness(index, u_ft, inputs, top=fc.top)
    table = faithfulness_table(index, u_ft, inputs, names=chosen).append_column("val_loss", pa.array(losses))
    rows = [a.to_dict() | {"method": agreement_label(a.representation, a.surrogate)} for a in agreements]
    ctx.record.write_png("faithfulness.png", plot_faithfulness(table, rows))
    ctx.record.write_parquet("faithfulness.parquet", table)
    evaluation = {STAGE: {
        "candidates": chosen, "k": fc.k, "subsets": len(subsets), "sampled": fc.sample is not None
        and len(subsets) < math.comb(len(chosen), fc.k), "normalize": fc.normalize, "top": fc.top,
        "representations": {v.tag: v.representation for v in valued},
        "target_norm": {v.tag: target_norm(v) for v in valued},
        "agreement": rows,
        "target_only_val_loss": runs.target_only, "base_val_loss": runs.base,
        "target_only": runs.record(()),
        "u_ft": {"mean": float(u_ft.mean()), "min": float(u_ft.min()), "max": float(u_ft.max())},
        "fine_tunes": {"trained": runs.trained, "reused": runs.reused}}}
    ctx.add(EvaluationRecord(evaluation=evaluation))


def format_faithfulness(summary: RunSummary) -> str:
    """The agreement table as `convalue faithfulness` prints it (the paper's Tab. subset-faithfulness)."""
    f = (summary.evaluation or {}).get(STAGE) or {}
    rows = f.get("agreement") or []
    top = f.get("top", 10)
    width = max([len("method")] + [len(r["method"]) for r in rows])
    lines = [f"agreement with u_FT over {f.get('subsets')} subsets of size {f.get('k')} of "
             f"{len(f.get('candidates') or [])} candidates (target {summary.data.get('target')}; "
             f"{f.get('normalize')} K and beta):",
             f"  {'method':<{width}}  {'Spearman rho':>12}  {'p-value':>8}  top-{top} overlap"]
    for r in rows:
        lines.append(f"  {r['method']:<{width}}  {r['spearman_rho']:>+12.4f}  {r['p_value']:>8.3f}  "
                     f"{r['top_overlap']}/{r['top']}")
    ft = f.get("fine_tunes") or {}
    lines.append(f"target-only validation loss {f.get('target_only_val_loss', float('nan')):.4f}; u_FT from "
                 f"{(f.get('u_ft') or {}).get('min', float('nan')):+.3g} to "
                 f"{(f.get('u_ft') or {}).get('max', float('nan')):+.3g}; fine-tunes: "
                 f"{ft.get('trained', 0)} trained, {ft.get('reused', 0)} read back from the run folder")
    return "\n".join(lines)
