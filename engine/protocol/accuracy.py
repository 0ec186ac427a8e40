"""Exact-match accuracy by greedy generation (paper Tab. eval_tasks: MGSM's exact match): for tasks whose answers a
function can check, generate each prompt's completion greedily and score it against its reference.

The prompt is rendered with the chat template as GRPO prompts are (convalue.engine.data.tokenize.tokenize_prompt);
the match function is r(completion, reference) -> float (the built-in numeric exact match of
convalue.engine.features.rewards by default), or a TRL reward function through `trl_reward`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from convalue.engine.data.examples import Example
from convalue.engine.data.tokenize import tokenize_prompt
from convalue.engine.features.rewards import RewardError, RewardFn, numeric_exact_match, score
from convalue.engine.model.loading import autocast

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

#: scores a batch: (prompts, completions, references) -> one float per completion
BatchScorer = Callable[[list[str], list[str], list[str]], list[float]]
#: TRL's reward_funcs signature: f(prompts, completions, **columns) -> list[float]
TrlRewardFunc = Callable[..., list[float]]

MAX_NEW_TOKENS = 256


@dataclass(frozen=True)
class AccuracyResult:
    """The mean score and each example's score and greedy completion."""

    mean: float
    scores: tuple[float, ...]
    completions: tuple[str, ...] = field(repr=False)

    def to_dict(self) -> dict:
        """JSON-ready fields (completions left out)."""
        return {"mean": self.mean, "scores": list(self.scores), "n": len(self.scores)}


def pointwise(fn: RewardFn = numeric_exact_match) -> BatchScorer:
    """A batch scorer from r(completion, reference) -> float, each value checked finite (rewards.score)."""
    def scorer(prompts: list[str], completions: list[str], references: list[str]) -> list[float]:
        return [score(fn, c, r, f"example {i}") for i, (c, r) in enumerate(zip(completions, references))]
    return scorer


def trl_reward(fn: TrlRewardFunc, *, reference_key: str = "answer", conversational: bool = False) -> BatchScorer:
    """A batch scorer from a TRL reward function: called as fn(prompts=..., completions=..., <reference_key>=
    references); conversational wraps prompts and completions as chat messages, as TRL passes them for chat data.
    A None (TRL's "not applicable") or a non-finite value is refused."""
    def scorer(prompts: list[str], completions: list[str], references: list[str]) -> list[float]:
        p: list[Any] = [[{"role": "user", "content": x}] for x in prompts] if conversational else list(prompts)
        c: list[Any] = ([[{"role": "assistant", "content": x}] for x in completions] if conversational
                        else list(completions))
        values = list(fn(prompts=p, completions=c, **{reference_key: list(references)}))
        if len(values) != len(completions):
            raise RewardError(f"reward function returned {len(values)} values for {len(completions)} completions")
        out = []
        for i, v in enumerate(values):
            if v is None or not math.isfinite(float(v)):
                raise RewardError(f"example {i}: reward function returned {v}, not a finite number")
            out.append(float(v))
        return out
    return scorer


def _example(item: tuple[str, str] | Example) -> Example:
    """A (prompt, reference) pair as a one-turn chat; an Example as it is (its last assistant turn the reference)."""
    if isinstance(item, Example):
        return item
    prompt, reference = item
    return Example((("user", prompt), ("assistant", reference)))


def greedy_completions(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, prompts: Sequence[Sequence[int]],
                       *, max_new_tokens: int = MAX_NEW_TOKENS, batch_size: int = 8, device: str = "cpu",
                       autocast_dtype: torch.dtype | None = None) -> list[str]:
    """Greedy (do_sample=False) completions of token-id prompts, batched with left padding, cut at the first
    end-of-sequence and decoded without special tokens (autocast_dtype: bf16 autocast, as in fine-tuning)."""
    # torch: only on a worker that runs the model; the driver imports this module without it
    import torch

    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    eos_id = tokenizer.eos_token_id
    was_training = model.training
    model.eval()
    out: list[str] = []
    try:
        for start in range(0, len(prompts), batch_size):
            batch = [list(p) for p in prompts[start:start + batch_size]]
            longest = max(len(p) for p in batch)
            ids = torch.full((len(batch), longest), pad_id, dtype=torch.long)
            mask = torch.zeros_like(ids)
            for i, p in enumerate(batch):
                ids[i, longest - len(p):] = torch.tensor(p, dtype=torch.long)
                mask[i, longest - len(p):] = 1
            with torch.no_grad(), autocast(device, autocast_dtype):
                gen = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), do_sample=False,
                                     max_new_tokens=max_new_tokens, pad_token_id=pad_id, eos_token_id=eos_id)
            for row in gen[:, longest:].tolist():
                cut = row.index(eos_id) if eos_id in row else len(row)
                out.append(tokenizer.decode(row[:cut], skip_special_tokens=True))
    finally:
        model.train(was_training)
    return out


def exact_match_accuracy(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase,
                         items: Sequence[tuple[str, str] | Example], *,
                         match: RewardFn = numeric_exact_match, scorer: BatchScorer | None = None,
                         max_new_tokens: int = MAX_NEW_TOKENS, batch_size: int = 8, device: str = "cpu",
                         autocast_dtype: torch.dtype | None = None) -> AccuracyResult:
    """Mean of r(greedy completion, reference) over (prompt, reference) pairs or chat Examples: `match` is r
    (default numeric exact match); a `scorer` (e.g. trl_reward(fn)) scores the whole batch instead."""
    if not items:
        raise ValueError("accuracy needs at least one (prompt, reference) pair")
    examples = [_example(x) for x in items]
    rendered = [tokenize_prompt(tokenizer, ex) for ex in examples]
    completions = greedy_completions(model, tokenizer, [p.input_ids for p in rendered],
                                     max_new_tokens=max_new_tokens, batch_size=batch_size, device=device,
                                     autocast_dtype=autocast_dtype)
    scorer = pointwise(match) if scorer is None else scorer
    prompts = [next((c for r, c in reversed(ex.messages) if r == "user"), "") for ex in examples]
    scores = [float(s) for s in scorer(prompts, completions, [p.reference for p in rendered])]
    return AccuracyResult(sum(scores) / len(scores), tuple(scores), tuple(completions))
