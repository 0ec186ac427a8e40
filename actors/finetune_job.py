"""Fine-tune jobs as Ray tasks: one fresh replica per job, LoRA (SFT or GRPO) on target + selection, measured on
every evaluation (the target's validation split and data.eval's sets)."""

from __future__ import annotations

import numpy as np
import ray

from convalue.actors.progress import report_attempt
from convalue.engine.config.sources import TARGET_VAL
from convalue.engine.data.evalsets import EvalSet
from convalue.engine.data.examples import Example
from convalue.engine.data.tokenize import TokenizedExample
from convalue.engine.features.gradex_features import log_odds_features, lora_state
from convalue.engine.features.rewards import load_reward
from convalue.engine.model.loading import autocast_dtype, load_model, load_tokenizer
from convalue.engine.model.spec import ReplicaSpec
from convalue.engine.protocol.accuracy import exact_match_accuracy
from convalue.engine.protocol.finetune import CurvePoint, FinetuneResult, evaluate_loss, finetune
from convalue.engine.protocol.grpo_train import grpo_finetune
from convalue.engine.protocol.measures import EvalScore


def _replica(spec: ReplicaSpec):
    """(theta_0 on the job's device, device, autocast dtype), with the job's torch threads and seed set."""
    # torch: only on a worker that runs the model; the driver imports this module without it
    import torch

    torch.set_num_threads(spec.threads)
    torch.manual_seed(spec.finetune.seed)
    return (load_model(spec.model_dir, spec.model.dtype, spec.device), spec.device,
            autocast_dtype(spec.device, spec.model.dtype))


def _accuracy(spec: ReplicaSpec, val_raw: list[Example] | tuple[Example, ...] | None, device: str, amp_dtype):
    """finetune.metrics `accuracy`: a function of a model giving its exact-match accuracy on the raw validation
    examples (None when accuracy is not measured)."""
    if "accuracy" not in spec.finetune.metrics or not val_raw:
        return None

    tokenizer, reward = load_tokenizer(spec.model_dir), load_reward(spec.finetune.accuracy_reward)
    return lambda model: exact_match_accuracy(
        model, tokenizer, list(val_raw), match=reward, max_new_tokens=spec.finetune.accuracy_max_new_tokens,
        batch_size=spec.finetune.eval_batch_size, device=device, autocast_dtype=amp_dtype).mean


def _measure(spec: ReplicaSpec, evals: list[EvalSet], device: str, amp_dtype):
    """A function of a model giving its values (loss, and accuracy where measured) on each of `evals`."""
    accuracies = {e.name: _accuracy(spec, e.examples, device, amp_dtype) for e in evals}

    def measure(model) -> dict[str, EvalScore]:
        out = {}
        for e in evals:
            loss = evaluate_loss(model, list(e.tokens), spec.finetune.eval_batch_size, spec.pad_id, device, amp_dtype)
            accuracy = accuracies[e.name]
            out[e.name] = EvalScore(loss, None if accuracy is None else accuracy(model))
        return out
    return measure


def _losses(spec: ReplicaSpec, val: list[TokenizedExample], evals: list[EvalSet], device: str, amp_dtype):
    """A function of a model giving its loss on the target's validation split and each of `evals` (a learning
    curve's point), or None without finetune.eval_every."""
    if not spec.finetune.eval_every:
        return None
    sets = {TARGET_VAL: list(val)} | {e.name: list(e.tokens) for e in evals}
    return lambda model: {name: evaluate_loss(model, tokens, spec.finetune.eval_batch_size, spec.pad_id, device,
                                              amp_dtype) for name, tokens in sets.items()}


def run_finetune_job(spec: ReplicaSpec, label: str, target: list[TokenizedExample],
                     aux: dict[str, list[TokenizedExample]], val: list[TokenizedExample],
                     with_base: bool, weights: dict[str, float] | None = None,
                     progress: object | None = None, val_raw: list[Example] | None = None,
                     evals: list[EvalSet] | None = None) -> FinetuneResult:
    """Load theta_0, optionally evaluate it, then fine-tune (aux groups drawn by `weights`, else uniformly; SFT, or
    GRPO under finetune.objective `grpo`) and evaluate (one job); progress: the run's progress actor, told where the
    job runs (retries are counted there); val_raw: the validation examples as text, for finetune.metrics `accuracy`;
    evals: data.eval's sets, each measured after training (and on theta_0 with the base) beside the validation split."""
    report_attempt(progress, "finetune", f"{label} (seed {spec.finetune.seed})")
    model, device, amp_dtype = _replica(spec)
    cfg = spec.finetune
    accuracy = _accuracy(spec, val_raw, device, amp_dtype)
    measure = _measure(spec, evals or [], device, amp_dtype)
    base = evaluate_loss(model, val, cfg.eval_batch_size, spec.pad_id, device, amp_dtype) if with_base else None
    base_accuracy = accuracy(model) if with_base and accuracy is not None else None
    base_evals = measure(model) if with_base else None
    measured: dict[str, EvalScore] = {}
    if cfg.objective == "grpo":
        result = grpo_finetune(model, load_tokenizer(spec.model_dir), spec.pad_id, cfg, spec.lora, label=label,
                               target=target, aux=aux, val=val, max_length=spec.model.max_length,
                               base_val_loss=base, device=device, autocast_dtype=amp_dtype, weights=weights,
                               accuracy=accuracy, keep=lambda m: measured.update(measure(m)))
    else:
        result = finetune(model, spec.pad_id, cfg, spec.lora, label=label, target=target, aux=aux, val=val,
                          base_val_loss=base, device=device, autocast_dtype=amp_dtype, weights=weights,
                          accuracy=accuracy, keep=lambda m: measured.update(measure(m)),
                          losses_of=_losses(spec, val, evals or [], device, amp_dtype))
    result.base_val_accuracy = base_accuracy
    result.evaluations = {TARGET_VAL: EvalScore(result.val_loss, result.val_accuracy)} | measured
    if result.curve is not None:  # the curve's last point: the end's values, measured above
        result.curve.append(CurvePoint(result.steps, {name: score.loss for name, score in result.evaluations.items()}))
    if with_base:
        result.base_evaluations = {TARGET_VAL: EvalScore(base, base_accuracy)} | base_evals
    return result


def run_base_eval(spec: ReplicaSpec, val: list[TokenizedExample], val_raw: list[Example] | None = None,
                  evals: list[EvalSet] | None = None) -> dict[str, EvalScore]:
    """The base model's values alone (when every fine-tune was already stored): the validation split's loss (and
    accuracy where measured) as `target_val`, and each of data.eval's sets."""
    model, device, amp_dtype = _replica(spec)
    accuracy = _accuracy(spec, val_raw, device, amp_dtype)
    loss = evaluate_loss(model, val, spec.finetune.eval_batch_size, spec.pad_id, device, amp_dtype)
    return {TARGET_VAL: EvalScore(loss, None if accuracy is None else accuracy(model))} | _measure(
        spec, evals or [], device, amp_dtype)(model)


def run_theta_star_job(spec: ReplicaSpec, target: list[TokenizedExample], aux: dict[str, list[TokenizedExample]],
                       val: list[TokenizedExample]) -> dict[str, np.ndarray]:
    """GradEx's theta*: the multitask fine-tune on target + every candidate (the evaluation's budget and mixing);
    its LoRA adapter."""
    model, device, amp_dtype = _replica(spec)
    state: dict[str, np.ndarray] = {}
    finetune(model, spec.pad_id, spec.finetune, spec.lora, label="theta* (target + every candidate)", target=target,
             aux=aux, val=val, device=device, autocast_dtype=amp_dtype, keep=lambda m: state.update(lora_state(m)))
    return state


def run_log_odds_job(spec: ReplicaSpec, state: dict[str, np.ndarray], sets: dict[str, list[TokenizedExample]],
                     dim: int, seed: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """GradEx's per-example features at theta* (engine.features.gradex_features.log_odds_features)."""
    # torch: only on a worker that runs the model; the driver imports this module without it
    import torch

    torch.set_num_threads(spec.threads)
    return log_odds_features(spec.model_dir, spec.model.dtype, spec.lora, state, sets, spec.pad_id, dim, seed,
                             spec.device)


finetune_task = ray.remote(max_retries=1)(run_finetune_job)
theta_star_task = ray.remote(max_retries=1)(run_theta_star_job)
log_odds_task = ray.remote(max_retries=1)(run_log_odds_job)
base_eval_task = ray.remote(max_retries=1)(run_base_eval)
