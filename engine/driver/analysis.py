"""What the analysis commands (`convalue faithfulness`, `convalue transfer`) add to a run's frame
(engine.driver.command): fine-tunes of target + S on a solver actor, every one the run folder holds reused; another
group as the target; the vectors gathered; the paper's surrogate names."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import ray

from convalue.actors.evaluation import EvaluationRequest, finetune_store, without_curve
from convalue.actors.gram import gather_rows
from convalue.actors.solver import subsets_on_actor
from convalue.engine.config import ConfigError, RunConfig
from convalue.engine.data.examples import DataError
from convalue.engine.data.prepare import PreparedData, target_splits
from convalue.engine.data.tokenize import tokenize_examples
from convalue.engine.driver.checks import solver_space
from convalue.engine.driver.command import RunContext
from convalue.engine.driver.featurize import FeaturizeResult
from convalue.engine.protocol.evaluate import label_of
from convalue.engine.selection.blocked import panels_of


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


def fine_tune(ctx: RunContext, subsets: list[tuple[str, ...]], stage: str,
              data: PreparedData | None = None) -> SubsetRuns:
    """Fine-tune target + S for every subset S and the target alone (data: another target's data, see
    retarget), on a solver actor; every fine-tune the run folder holds is read back, not trained."""
    data = data or ctx.data
    names = [g.name for g in data.candidates]
    request = EvaluationRequest(cfg=ctx.cfg, spec=ctx.replica, tokenizer=ctx.tokenizer, data=data,
                                names=names, scores={}, beta=np.zeros(len(names)), given=None,
                                run_dir=ctx.run_dir, train_spec=ctx.train_spec, runners=ctx.runners)
    wanted = list(dict.fromkeys([(), *(tuple(sorted(s)) for s in subsets)]))
    stored = _records(ctx, request, wanted)
    held = sum(r is not None for r in stored.values())
    ctx.stage = stage
    ctx.finetune_stages.add(stage)
    losses, target_only, base = subsets_on_actor(request, subsets, ctx.session.progress, ctx.outcome, stage)
    records = _records(ctx, request, wanted)
    return SubsetRuns(losses=losses, target_only=target_only, base=base, records=records,
                      trained=len(wanted) - held, reused=held)


def _records(ctx: RunContext, request: EvaluationRequest,
             subsets: list[tuple[str, ...]]) -> dict[tuple, dict | None]:
    """The stored record of each subset's fine-tune, as actors.evaluation.run_subsets keys it (finetune.seed,
    uniform draws, finetune.rho), or None where the run folder does not hold it."""
    store = finetune_store(without_curve(request))
    seed = ctx.cfg.finetune.seed
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
    panels = panels_of(features.blocks)
    n = len(features.names)
    refs = [features.refs[b.file] for p in panels for b in p.blocks]
    return ray.get(gather_rows.remote(n, panels, *refs))


def require_gram_space(cfg: RunConfig, n: int, command: str) -> None:
    """Refuse a solve in gradient space (solver.space, or `auto` above its threshold): the command needs K."""
    if solver_space(cfg, n) == "gradients":
        raise ConfigError(f"`convalue {command}` needs the Gram matrix K of the {n} candidates: set solver.space "
                          "to `gram`", field="solver.space", value=cfg.solver.space)


def agreement_label(tag: str, surrogate: str) -> str:
    """A representation's surrogate as the paper names it: One-Step, One-Step + KMM, TV, TV + KMM."""
    return label_of(tag + ("+kmm" if surrogate == "kmm" else ""))
