"""Fixed-compute LoRA fine-tune on target + selection (paper Alg. 1) and target validation loss."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from convalue.engine.config import FinetuneConfig, LoraConfig
from convalue.engine.data.tokenize import TokenizedExample
from convalue.engine.features.batching import pad_batch
from convalue.engine.features.losses import per_example_loss
from convalue.engine.model.loading import attach_lora, autocast
from convalue.engine.protocol.measures import EvalScore


@dataclass
class CurvePoint:
    """One point of a fine-tune's learning curve (finetune.eval_every): each evaluation's loss after `step` steps."""

    step: int
    losses: dict[str, float]


@dataclass
class FinetuneResult:
    """What one fine-tune run achieved on the target's validation split (val_loss, val_accuracy) and on every
    evaluation (evaluations)."""

    label: str
    groups: list[str]
    steps: int
    target_steps: int
    aux_steps: int
    val_loss: float
    base_val_loss: float | None
    first_train_loss: float
    last_train_loss: float
    seconds: float
    val_accuracy: float | None = None  # finetune.metrics `accuracy`
    base_val_accuracy: float | None = None
    objective: str = "sft"  # finetune.objective
    train_reward_first: float | None = None  # objective `grpo`: mean reward of the first quarter of the steps
    train_reward_last: float | None = None  # ... and of the last quarter
    train_rewards: list[float] | None = None  # objective `grpo`: each step's mean reward
    evaluations: dict[str, EvalScore] | None = None  # every evaluation's values (target_val and data.eval's)
    base_evaluations: dict[str, EvalScore] | None = None  # ... of theta_0, where this job measured it
    curve: list[CurvePoint] | None = None  # finetune.eval_every: the losses every eval_every steps and at the end

    def to_dict(self) -> dict:
        """JSON-ready fields."""
        return asdict(self)


def evaluate_loss(model, examples: list[TokenizedExample], batch_size: int, pad_id: int, device: str = "cpu",
                  autocast_dtype=None) -> float:
    """Mean over examples of the per-example response-token cross-entropy."""
    import torch  # heavy: loaded where a fine-tune or evaluation runs, not where the driver plans one

    model.eval()
    total, n = 0.0, 0
    with torch.no_grad(), autocast(device, autocast_dtype):
        order = sorted(range(len(examples)), key=lambda i: len(examples[i]))
        for s in range(0, len(order), batch_size):
            batch = [examples[i] for i in order[s : s + batch_size]]
            ids, mask, labels = (t.to(device) for t in pad_batch(batch, pad_id))
            total += float(per_example_loss(model, ids, mask, labels).sum())
            n += len(batch)
    return total / n


def mixing_schedule(steps: int, rho: float, n_aux_groups: int, seed: int,
                    weights: list[float] | None = None, additive: bool = False) -> list[int]:
    """Per step: -1 for a target batch (probability rho), else the auxiliary group drawn uniformly, or by
    `weights` (one per group, summing to 1) from a stream of its own. `steps` steps in all (the fixed budget), or,
    `additive`, the same draws continued until `steps` target steps are drawn (the fixed schedule is its prefix)."""
    if additive and rho <= 0:
        raise ValueError("an additive schedule needs rho > 0")
    rng = np.random.default_rng([seed, 0xA1])
    weighted = None if weights is None else np.random.default_rng([seed, 0xA2])
    out: list[int] = []
    n_target = 0
    while (n_target if additive else len(out)) < steps:
        if n_aux_groups == 0 or rng.random() < rho:
            n_target += 1
            out.append(-1)
            continue
        # the uniform draw is made either way, so a seed gives every mixture of n groups the same target steps
        uniform = int(rng.integers(n_aux_groups))
        out.append(uniform if weighted is None else int(weighted.choice(n_aux_groups, p=weights)))
    return out


def finetune(model, pad_id: int, cfg: FinetuneConfig, lora: LoraConfig, *, label: str,
             target: list[TokenizedExample], aux: dict[str, list[TokenizedExample]],
             val: list[TokenizedExample], base_val_loss: float | None = None, device: str = "cpu",
             autocast_dtype=None, weights: dict[str, float] | None = None,
             accuracy: Callable[[Any], float] | None = None,
             keep: Callable[[Any], None] | None = None,
             losses_of: Callable[[Any], dict[str, float]] | None = None) -> FinetuneResult:
    """Train a fresh LoRA adapter on `model` (theta_0) for cfg.steps steps mixing target and aux (its groups drawn
    by `weights`, else uniformly; cfg.budget `additive`: cfg.steps target steps and the auxiliary ones on top);
    evaluate on val (and, given `accuracy`, measure it on the trained model; given `keep`, hand it the trained
    model, e.g. to keep its adapter). Given `losses_of` and cfg.eval_every, the learning curve's points before the
    end: losses_of(model) every eval_every steps (the caller adds the end's; the training is the same without).

    autocast_dtype: bf16 autocast for the forward passes (CUDA replicas with model.dtype bfloat16), as in featurisation.
    """
    # heavy: loaded where a fine-tune runs, not where the driver plans one
    import torch
    from transformers import get_cosine_schedule_with_warmup

    if not target:
        raise ValueError("fine-tune needs target training examples")
    t0 = time.perf_counter()
    peft_model = attach_lora(model, lora)
    params = [p for p in peft_model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr)
    names = sorted(aux)
    if weights is not None and set(weights) != set(names):
        raise ValueError(f"mixture weights for {sorted(weights)}, but the auxiliary groups are {names}")
    additive = cfg.budget == "additive"
    plan = mixing_schedule(cfg.steps, cfg.rho, len(names), cfg.seed,
                           None if weights is None else [weights[n] for n in names], additive=additive)
    sched = get_cosine_schedule_with_warmup(opt, max(1, math.ceil(0.03 * len(plan))), len(plan))
    rng = np.random.default_rng([cfg.seed, 0xB2])
    # additive: auxiliary batches from a stream of their own, so the target's batches are target-only's, in order
    aux_rng = np.random.default_rng([cfg.seed, 0xB3]) if additive else rng
    losses, curve = [], []
    peft_model.train()
    for step, src in enumerate(plan, start=1):
        pool = target if src < 0 else aux[names[src]]
        idx = (rng if src < 0 else aux_rng).choice(len(pool), size=min(cfg.batch_size, len(pool)), replace=False)
        ids, mask, labels = (t.to(device) for t in pad_batch([pool[i] for i in idx], pad_id))
        with autocast(device, autocast_dtype):
            loss = per_example_loss(peft_model, ids, mask, labels).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
        opt.step()
        sched.step()
        losses.append(loss.item())
        if losses_of is not None and cfg.eval_every and step % cfg.eval_every == 0 and step < len(plan):
            curve.append(CurvePoint(step, losses_of(peft_model)))  # no_grad, no draws: the training is unchanged
            peft_model.train()
    val_loss = evaluate_loss(peft_model, val, cfg.eval_batch_size, pad_id, device, autocast_dtype)
    peft_model.eval()
    if keep is not None:
        keep(peft_model)
    return FinetuneResult(
        label=label, groups=names, steps=len(plan), target_steps=sum(1 for s in plan if s < 0),
        aux_steps=sum(1 for s in plan if s >= 0), val_loss=val_loss, base_val_loss=base_val_loss,
        first_train_loss=losses[0], last_train_loss=losses[-1], seconds=time.perf_counter() - t0,
        val_accuracy=None if accuracy is None else accuracy(peft_model),
        curve=curve if losses_of is not None and cfg.eval_every else None,
    )
