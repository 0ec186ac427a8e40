"""GRPO fine-tunes for the evaluation protocol (finetune.objective `grpo`): the same fixed-compute LoRA run as the SFT
fine-tune (paper Alg. 1: T steps, each a target batch with probability rho, else a batch of one bought group), with
each step a GRPO update instead of a cross-entropy one.

A step takes `batch_size` prompts of its source, samples G completions of each from the current policy (seeded by
finetune.seed and the step), scores them with the reward, gives each completion its group-relative advantage and
takes one AdamW step on the GRPO surrogate of engine.features.grpo (Shao et al. 2024, eq. 3) with the k3 KL to
theta_0, whose log-probabilities are the model's with the LoRA adapter disabled. The prompts and references come from
the tokenised SFT examples: the tokens before the last assistant turn, and that turn's text.
"""

from __future__ import annotations

import math
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from convalue.engine.config import FinetuneConfig, LoraConfig
from convalue.engine.data.tokenize import IGNORE, PromptExample, TokenizedExample
from convalue.engine.features.batching import pad_batch
from convalue.engine.features.grpo import (
    generate_completions,
    surrogate_loss,
    surrogate_rows,
    token_logprobs,
)
from convalue.engine.features.losses import per_row_mean, response_logits
from convalue.engine.features.rewards import RewardError, load_reward
from convalue.engine.model.loading import attach_lora, autocast
from convalue.engine.protocol.accuracy import BatchScorer, pointwise, trl_reward
from convalue.engine.protocol.finetune import FinetuneResult, evaluate_loss, mixing_schedule

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase


class GrpoTrainError(ValueError):
    """A GRPO fine-tune that cannot run (no prompts, no room to generate, a failing reward), naming where."""


@dataclass(frozen=True)
class GrpoStep:
    """One step's record: its source, the mean reward of its completions, the mean k3 KL to theta_0 (before the
    update), the surrogate loss and how many of its prompts had equal rewards (zero advantage)."""

    step: int
    source: str
    reward: float
    kl: float
    loss: float
    zero_advantage_prompts: int


def prompt_of(example: TokenizedExample, tokenizer: PreTrainedTokenizerBase) -> PromptExample:
    """The GRPO prompt of a tokenised SFT example: the tokens before its last labelled run, and that run decoded
    (special tokens left out) as the reference."""
    labels = example.labels
    end = max((i for i, x in enumerate(labels) if x != IGNORE), default=None)
    if end is None:
        raise GrpoTrainError("an example without response tokens has no reference")
    start = end
    while start > 0 and labels[start - 1] != IGNORE:
        start -= 1
    reference = tokenizer.decode(list(labels[start:end + 1]), skip_special_tokens=True)
    return PromptExample(tuple(example.input_ids[:start]), reference)


def reward_scorer(cfg: FinetuneConfig) -> BatchScorer:
    """finetune.grpo_reward as a batch scorer: pointwise r(completion, reference), or a TRL reward function."""
    try:
        fn = load_reward(cfg.grpo_reward)
    except RewardError as exc:
        raise GrpoTrainError(f"finetune.grpo_reward: {exc}") from None
    if cfg.grpo_reward_signature == "trl":
        return trl_reward(fn, reference_key=cfg.grpo_reward_column)
    return pointwise(fn)


def _score(scorer: BatchScorer, prompts: list[str], completions: list[str], references: list[str],
           where: str) -> np.ndarray:
    """The scorer's rewards as a float array; any failure names `where`."""
    try:
        values = scorer(prompts, completions, references)
    except RewardError as exc:
        raise GrpoTrainError(f"{where}: {exc}") from None
    except Exception as exc:  # user code: one clear error naming the batch, never a skipped step
        raise GrpoTrainError(f"{where}: the reward raised {type(exc).__name__}: {exc}") from exc
    if len(values) != len(completions):
        raise GrpoTrainError(f"{where}: the reward returned {len(values)} values for {len(completions)} completions")
    return np.asarray(values, dtype=np.float64)


def check_references(scorer: BatchScorer, tokenizer: PreTrainedTokenizerBase,
                     pools: dict[str, list[PromptExample]]) -> None:
    """Refuse, before any training, a source whose references the reward cannot score (each reference is scored as
    its own completion: a built-in numeric reward needs a numeric final answer)."""
    for name, pool in pools.items():
        if not pool:
            raise GrpoTrainError(f"{name}: no prompts to train on")
        refs = [p.reference for p in pool]
        _score(scorer, [tokenizer.decode(p.input_ids) for p in pool], refs, refs,
               f"{name}: GRPO needs prompts with references the reward can check")


def sample_completions(model: torch.nn.Module, prompts: Sequence[PromptExample], *, generations: int,
                       max_new_tokens: int, temperature: float, top_p: float, max_length: int, pad_id: int,
                       eos_id: int, seed: int, device: str = "cpu",
                       autocast_dtype: torch.dtype | None = None) -> list[list[tuple[int, ...]]]:
    """G completions per prompt within model.max_length (engine.features.grpo.generate_completions)."""
    longest = max(len(p) for p in prompts)
    room = min(max_new_tokens, max_length - longest)
    if room <= 0:
        raise GrpoTrainError(f"a prompt of {longest} tokens leaves no room to generate within "
                             f"model.max_length={max_length}")
    return generate_completions(model, prompts, generations=generations, room=room, temperature=temperature,
                                top_p=top_p, pad_id=pad_id, eos_id=eos_id, seed=seed, device=device,
                                autocast_dtype=autocast_dtype)


class GrpoStepper:
    """One GRPO update of a LoRA model per call: sample, score, advantages, surrogate with KL to theta_0, AdamW."""

    def __init__(self, peft_model: Any, tokenizer: PreTrainedTokenizerBase, pad_id: int, cfg: FinetuneConfig,
                 scorer: BatchScorer, optimizer: Any, params: list, *, max_length: int, label: str = "",
                 device: str = "cpu", autocast_dtype: torch.dtype | None = None):
        self.label = label
        self.model, self.tokenizer, self.pad_id, self.cfg, self.scorer = peft_model, tokenizer, pad_id, cfg, scorer
        self.optimizer, self.params, self.max_length = optimizer, params, max_length
        self.device, self.autocast_dtype = device, autocast_dtype
        self.eos_id = tokenizer.eos_token_id

    def _logprobs(self, ids: torch.Tensor, mask: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """Token log-probabilities of the completions under the sampling temperature, and the valid mask."""
        with autocast(self.device, self.autocast_dtype):
            logits, target, valid = response_logits(self.model, ids, mask, labels)
            return token_logprobs(logits, target, self.cfg.grpo_temperature), valid

    def step(self, index: int, source: str, batch: list[PromptExample]) -> GrpoStep:
        """Sample G completions of each prompt, score them and take one optimizer step; the step's record."""
        # torch: only on a worker that runs the model; the driver imports this module without it
        import torch

        cfg, G = self.cfg, self.cfg.grpo_generations
        sampled = sample_completions(
            self.model, batch, generations=G, max_new_tokens=cfg.grpo_max_new_tokens,
            temperature=cfg.grpo_temperature, top_p=cfg.grpo_top_p, max_length=self.max_length, pad_id=self.pad_id,
            eos_id=self.eos_id, seed=zlib.crc32(f"{cfg.seed}/grpo/{index}".encode()), device=self.device,
            autocast_dtype=self.autocast_dtype)
        prompts = [self.tokenizer.decode(p.input_ids) for p in batch for _ in range(G)]
        texts = [self.tokenizer.decode(c, skip_special_tokens=True) for cs in sampled for c in cs]
        refs = [p.reference for p in batch for _ in range(G)]
        where = f"{self.label}: {source}, step {index}"
        rewards = _score(self.scorer, prompts, texts, refs, where).reshape(len(batch), G)
        rows, adv, weight = surrogate_rows(batch, sampled, rewards)
        if not rows:
            raise GrpoTrainError(f"{where}: no completion tokens were sampled")
        ids, mask, labels = (t.to(self.device) for t in pad_batch(rows, self.pad_id))
        self.model.train()
        logp, valid = self._logprobs(ids, mask, labels)
        with torch.no_grad(), self.model.disable_adapter():  # pi_ref: theta_0, the adapter off
            ref_logp, _ = self._logprobs(ids, mask, labels)
        w = torch.tensor(weight, dtype=torch.float32, device=self.device)
        loss = surrogate_loss(logp, ref_logp, torch.tensor(adv, dtype=torch.float32, device=self.device), w, valid,
                              cfg.grpo_kl_coef)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.params, cfg.max_grad_norm)
        self.optimizer.step()
        with torch.no_grad():
            log_r = ref_logp - logp.detach()
            kl = float((per_row_mean(torch.exp(log_r) - log_r - 1, valid) * w).sum())
        return GrpoStep(index, source, float(rewards.mean()), kl, float(loss.item()),
                        int(sum(np.ptp(r) == 0 for r in rewards)))


def quarter_mean(values: list[float], last: bool) -> float:
    """The mean of the first (or last) quarter of values, at least one."""
    n = max(1, len(values) // 4)
    return float(np.mean(values[-n:] if last else values[:n]))


def grpo_finetune(model: Any, tokenizer: PreTrainedTokenizerBase, pad_id: int, cfg: FinetuneConfig,
                  lora: LoraConfig, *, label: str, target: list[TokenizedExample],
                  aux: dict[str, list[TokenizedExample]], val: list[TokenizedExample], max_length: int,
                  scorer: BatchScorer | None = None, base_val_loss: float | None = None, device: str = "cpu",
                  autocast_dtype: torch.dtype | None = None, weights: dict[str, float] | None = None,
                  accuracy: Callable[[Any], float] | None = None, keep: Callable[[Any], None] | None = None,
                  on_step: Callable[[GrpoStep], None] | None = None) -> FinetuneResult:
    """Train a fresh LoRA adapter on `model` (theta_0) for cfg.steps GRPO steps mixing target and aux prompts as the
    SFT fine-tune mixes its batches; evaluate the validation loss (and `accuracy`), as finetune() does.

    scorer: the reward (default: finetune.grpo_reward); on_step: told every step's GrpoStep; keep: handed the trained
    model. The result's train losses are the surrogate's; train_reward_first/last the mean reward of the first and
    last quarter of the steps.
    """
    # torch: only on a worker that runs the model; the driver imports this module without it
    import torch
    from transformers import get_cosine_schedule_with_warmup

    if not target:
        raise ValueError("fine-tune needs target training examples")
    t0 = time.perf_counter()
    scorer = reward_scorer(cfg) if scorer is None else scorer
    names = sorted(aux)
    if weights is not None and set(weights) != set(names):
        raise ValueError(f"mixture weights for {sorted(weights)}, but the auxiliary groups are {names}")
    pools = {"target": [prompt_of(t, tokenizer) for t in target]}
    pools |= {f"group {n!r}": [prompt_of(t, tokenizer) for t in aux[n]] for n in names}
    check_references(scorer, tokenizer, {f"{label}: {name}": pool for name, pool in pools.items()})
    sources = ["target", *(f"group {n!r}" for n in names)]
    peft_model = attach_lora(model, lora)
    params = [p for p in peft_model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr)
    additive = cfg.budget == "additive"
    plan = mixing_schedule(cfg.steps, cfg.rho, len(names), cfg.seed,
                           None if weights is None else [weights[n] for n in names], additive=additive)
    sched = get_cosine_schedule_with_warmup(opt, max(1, math.ceil(0.03 * len(plan))), len(plan))
    rng = np.random.default_rng([cfg.seed, 0xB2])  # the SFT fine-tune's batch draws
    aux_rng = np.random.default_rng([cfg.seed, 0xB3]) if additive else rng  # as finetune()'s
    stepper = GrpoStepper(peft_model, tokenizer, pad_id, cfg, scorer, opt, params, max_length=max_length,
                          label=label, device=device, autocast_dtype=autocast_dtype)
    records: list[GrpoStep] = []
    for index, src in enumerate(plan):
        pool = pools[sources[src + 1]]
        idx = (rng if src < 0 else aux_rng).choice(len(pool), size=min(cfg.batch_size, len(pool)), replace=False)
        records.append(stepper.step(index, sources[src + 1], [pool[i] for i in idx]))
        sched.step()
        if on_step is not None:
            on_step(records[-1])
    val_loss = evaluate_loss(peft_model, val, cfg.eval_batch_size, pad_id, device, autocast_dtype)
    peft_model.eval()
    if keep is not None:
        keep(peft_model)
    rewards = [r.reward for r in records]
    return FinetuneResult(
        label=label, groups=names, steps=len(plan), target_steps=sum(1 for s in plan if s < 0),
        aux_steps=sum(1 for s in plan if s >= 0), val_loss=val_loss, base_val_loss=base_val_loss,
        first_train_loss=records[0].loss, last_train_loss=records[-1].loss, seconds=time.perf_counter() - t0,
        val_accuracy=None if accuracy is None else accuracy(peft_model), objective="grpo",
        train_reward_first=quarter_mean(rewards, last=False), train_reward_last=quarter_mean(rewards, last=True),
        train_rewards=rewards,
    )
