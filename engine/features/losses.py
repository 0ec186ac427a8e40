"""Per-example losses of a causal LM: cross-entropy at the labelled positions, the LM head applied only there,
and the loss of suffixes that continue a shared prefix's keys and values."""

from __future__ import annotations

import inspect
import math
from typing import TYPE_CHECKING

from convalue.engine.data.tokenize import IGNORE, TokenizedExample
from convalue.engine.features.batching import pad_batch

if TYPE_CHECKING:
    import torch


def decoder_and_head(model: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Module] | None:
    """(decoder, lm_head) of a causal LM (through a PEFT wrapper), or None if logits need the full forward."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if getattr(base.config, "final_logit_softcapping", None):
        return None
    try:
        decoder, head = base.get_decoder(), base.get_output_embeddings()
    except (AttributeError, NotImplementedError):
        return None
    return (decoder, head) if decoder is not None and head is not None else None


def cache_keyword(decoder: torch.nn.Module) -> str:
    """The decoder's keyword for a key/value cache: `cache` in transformers 5 (which drops `past_key_values` in
    5.40), `past_key_values` in 4.x."""
    return "cache" if "cache" in inspect.signature(decoder.forward).parameters else "past_key_values"


def per_row_mean(values: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Per-example mean of token values given at the valid positions (row-major): a [B] tensor."""
    # torch: only where a model runs; `convalue --help`/`status` import this module without it
    import torch

    rows = torch.nonzero(valid, as_tuple=True)[0]
    total = torch.zeros(valid.shape[0], dtype=values.dtype, device=values.device).index_add(0, rows, values)
    return total / valid.sum(dim=1).clamp(min=1)


def response_logits(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor,
                    labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(logits, targets, valid): the next-token logits at labelled positions only (valid: [B, L-1], row-major).

    The LM head (a vocabulary-sized matmul) is applied only where a label exists.
    """
    target = labels[:, 1:]
    valid = target != IGNORE
    parts = decoder_and_head(model)
    if parts is None:
        logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1][valid]
    else:
        decoder, head = parts
        logits = head(decoder(input_ids=ids, attention_mask=mask).last_hidden_state[:, :-1][valid])
    return logits, target[valid], valid


def mean_token_ce(logits: torch.Tensor, target: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Per-example mean cross-entropy from the logits and targets at the valid positions: a [B] tensor."""
    # torch: only where a model runs; `convalue --help`/`status` import this module without it
    import torch

    return per_row_mean(torch.nn.functional.cross_entropy(logits.float(), target, reduction="none"), valid)


def per_example_loss(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor,
                     labels: torch.Tensor) -> torch.Tensor:
    """Mean token cross-entropy over each example's response tokens: a [B] tensor."""
    return mean_token_ce(*response_logits(model, ids, mask, labels))



def prefix_forward(model: torch.nn.Module, prefix_ids: tuple[int, ...], rows: int,
                   device: str) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The shared prefix run through the decoder once for `rows` owners: [(keys, values)] per layer, with their graph."""
    # torch: only where a model runs; `convalue --help`/`status` import this module without it
    import torch

    decoder, _ = decoder_and_head(model)
    prefix = torch.tensor([prefix_ids] * rows, device=device)
    out = decoder(input_ids=prefix, attention_mask=torch.ones_like(prefix), use_cache=True)
    cache = out[cache_keyword(decoder)]
    return [(layer.keys, layer.values) for layer in cache.layers]


def shared_prefix_loss(model: torch.nn.Module, examples: list[TokenizedExample], owners: list[int], P: int,
                       pad_id: int, device: str, runs: list[list[int]],
                       prefix_kv: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, list[int]]:
    """Per-example losses of the suffixes after the first P tokens (shared_prefix_length), whose keys and values
    `prefix_kv` (leaves, one row per owner in sorted order) are expanded to each owner's examples.

    Returns (losses, prefix rows' owners); losses are in the order of the concatenated `runs` (index lists into
    examples, one decoder call each). Backward leaves each owner's prefix row the gradient summed over that
    owner's examples, which is exactly what a per-group mean needs.
    """
    # torch: only where a model runs; `convalue --help`/`status` import this module without it
    import torch
    from transformers import DynamicCache

    decoder, head = decoder_and_head(model)
    keyword = cache_keyword(decoder)
    groups = sorted(set(owners))
    row = {g: i for i, g in enumerate(groups)}
    losses = []
    for run in runs:
        select = torch.tensor([row[owners[i]] for i in run], device=device)
        expanded = DynamicCache()
        for i, (keys, values) in enumerate(prefix_kv):
            expanded.update(keys.index_select(0, select), values.index_select(0, select), i)
        suffix = [TokenizedExample(examples[i].input_ids[P:], examples[i].labels[P:]) for i in run]
        ids, mask, labels = (t.to(device) for t in pad_batch(suffix, pad_id))
        full_mask = torch.cat([torch.ones(len(run), P, dtype=mask.dtype, device=device), mask], dim=1)
        positions = (torch.arange(ids.shape[1], device=device) + P).expand(ids.shape[0], -1)
        hidden = decoder(input_ids=ids, attention_mask=full_mask, position_ids=positions, use_cache=True,
                         **{keyword: expanded}).last_hidden_state[:, :-1]
        target = labels[:, 1:]
        valid = target != IGNORE
        losses.append(mean_token_ce(head(hidden[valid]), target[valid], valid))
    return torch.cat(losses), groups


def mean_token_log_odds(logits: torch.Tensor, target: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Per-example f(z; theta): the mean over response tokens of the token log-odds log p_t - log(1 - p_t) (App.
    GradEx, generative SFT), from response_logits' (logits, target, valid): a [B] tensor to backpropagate."""
    # torch: only where a model runs; `convalue --help`/`status` import this module without it
    import torch

    logp = torch.log_softmax(logits.float(), dim=-1).gather(1, target[:, None])[:, 0]
    logp = logp.clamp(max=-1e-7)  # p = 1 in float32 would give an infinite log-odds
    log1m = torch.where(logp > -math.log(2), torch.log(-torch.expm1(logp)), torch.log1p(-torch.exp(logp)))
    return per_row_mean(logp - log1m, valid)
