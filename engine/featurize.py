"""Mean SFT-loss gradients of groups at theta_0 over the LoRA B parameters (Ray-free; actors wrap it)."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from engine.tokenize import IGNORE, TokenizedExample


@dataclass(frozen=True)
class WorkItem:
    """One group's tokenised preview: the unit of work a gradient worker receives."""

    name: str
    examples: tuple[TokenizedExample, ...]


def pad_batch(examples: list[TokenizedExample], pad_id: int):
    """Right-padded input_ids, attention_mask and labels tensors."""
    import torch

    L = max(len(e) for e in examples)
    ids = torch.full((len(examples), L), pad_id, dtype=torch.long)
    labels = torch.full((len(examples), L), IGNORE, dtype=torch.long)
    mask = torch.zeros((len(examples), L), dtype=torch.long)
    for i, e in enumerate(examples):
        n = len(e)
        ids[i, :n] = torch.tensor(e.input_ids)
        labels[i, :n] = torch.tensor(e.labels)
        mask[i, :n] = 1
    return ids, mask, labels


def per_example_loss(model, ids, mask, labels):
    """Mean token cross-entropy over each example's response tokens: a [B] tensor."""
    import torch

    logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
    target = labels[:, 1:]
    ce = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), target.reshape(-1), ignore_index=IGNORE, reduction="none"
    ).view(target.shape)
    n = (target != IGNORE).sum(dim=1)
    return ce.sum(dim=1) / n.clamp(min=1)


class GroupGradients:
    """Computes g = (1/m) sum_j grad l(x_j; theta_0) over the lora_B parameters, then projects it."""

    def __init__(self, peft_model, params: list, projector, pad_id: int, batch_size: int = 8,
                 device: str = "cpu", autocast_dtype=None):
        self.model = peft_model.eval()  # eval: no dropout, deterministic
        self.params = params
        self.projector = projector
        self.pad_id = pad_id
        self.batch_size = batch_size
        self.device = device
        self.autocast_dtype = autocast_dtype
        self.tokens = 0
        self.seconds = 0.0

    @property
    def dim(self) -> int:
        """d: number of featurised parameters."""
        return sum(p.numel() for p in self.params)

    def raw_gradient(self, examples: tuple[TokenizedExample, ...]) -> np.ndarray:
        """The unprojected mean gradient (float32, length d)."""
        import torch

        if not examples:
            raise ValueError("cannot take the gradient of an empty group")
        t0 = time.perf_counter()
        for p in self.params:
            p.grad = None
        m = len(examples)
        # sort by length so each batch pads little; the mean does not depend on order
        order = sorted(range(m), key=lambda i: len(examples[i]))
        for start in range(0, m, self.batch_size):
            batch = [examples[i] for i in order[start : start + self.batch_size]]
            ids, mask, labels = (t.to(self.device) for t in pad_batch(batch, self.pad_id))
            ctx = (torch.autocast(device_type=self.device.split(":")[0], dtype=self.autocast_dtype)
                   if self.autocast_dtype is not None else torch.autocast("cpu", enabled=False))
            with ctx:
                loss = per_example_loss(self.model, ids, mask, labels).sum() / m
            loss.backward()
            self.tokens += int(mask.sum())
        flat = torch.cat([p.grad.detach().float().reshape(-1) for p in self.params]).cpu().numpy()
        for p in self.params:
            p.grad = None
        self.seconds += time.perf_counter() - t0
        return flat

    def featurize(self, items: list[WorkItem]) -> np.ndarray:
        """Projected mean gradients of several groups: a [len(items), p] float32 block."""
        raw = np.stack([self.raw_gradient(it.examples) for it in items])
        return self.projector.project(raw)
