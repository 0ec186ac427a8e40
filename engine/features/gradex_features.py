"""GradEx's features (paper App. GradEx), Ray-free: the LoRA adapter of the multitask fine-tune theta*, and at
theta* each example's log-odds f(z; theta*) and its gradient projected to a few dimensions."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from convalue.engine.config import LoraConfig
from convalue.engine.data.tokenize import TokenizedExample
from convalue.engine.features.batching import pad_batch
from convalue.engine.features.gradients import take_flat_grad
from convalue.engine.features.losses import mean_token_log_odds, response_logits
from convalue.engine.features.projection import make_projector
from convalue.engine.model.loading import attach_lora, load_model


def lora_state(peft_model: Any) -> dict[str, np.ndarray]:
    """The LoRA parameters of a model (theta* after a fine-tune), by name, as float32 arrays."""
    return {n: p.detach().float().cpu().numpy() for n, p in peft_model.named_parameters() if "lora_" in n}


def load_lora_state(peft_model: Any, state: dict[str, np.ndarray]) -> list[tuple[str, Any]]:
    """Set a fresh adapter's LoRA parameters to `state` (names must match) and make them the trainable ones;
    returns them, in a fixed order."""
    # torch: only on a worker that runs the model; the driver imports this module without it
    import torch

    named = [(n, p) for n, p in peft_model.named_parameters() if "lora_" in n]
    missing = sorted(set(state) ^ {n for n, _ in named})
    if missing:
        raise ValueError(f"theta*'s adapter does not match this model's: {missing[:3]}")
    with torch.no_grad():
        for n, p in named:
            p.copy_(torch.from_numpy(state[n]).to(p.dtype))
    for _, p in peft_model.named_parameters():
        p.requires_grad_(False)
    for _, p in named:
        p.requires_grad_(True)
    return named


def log_odds_features(model_dir: str | Path, dtype: str, lora: LoraConfig, state: dict[str, np.ndarray],
                      sets: dict[str, list[TokenizedExample]], pad_id: int, dim: int, seed: int,
                      device: str = "cpu") -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """For each named set of examples: (phi [n, dim], f0 [n]): at theta* (state on a fresh adapter of the base
    model), every example's mean token log-odds f0 and its gradient, projected by one seeded Gaussian projection."""
    model = attach_lora(load_model(Path(model_dir), dtype, device), lora, dropout=0.0)
    named = load_lora_state(model, state)
    params = [p for _, p in named]
    projector = make_projector("gaussian", sum(p.numel() for p in params), dim, seed)
    model.eval()
    out = {}
    for name, examples in sets.items():
        phi, f0 = np.empty((len(examples), dim), np.float64), np.empty(len(examples))
        for i, ex in enumerate(examples):  # one example at a time: its own gradient
            ids, mask, labels = pad_batch([ex], pad_id)
            f = mean_token_log_odds(*response_logits(model, ids.to(device), mask.to(device), labels.to(device)))[0]
            f.backward()
            phi[i] = projector.project(take_flat_grad(params))
            f0[i] = float(f.detach())
        out[name] = (phi, f0)
    return out
