"""Task vectors (Ray-free; actors wrap it): tau = theta - theta_0 after a few AdamW steps on one group alone."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np

from convalue.engine.data.tokenize import TokenizedExample, WorkItem
from convalue.engine.features.batching import pad_batch
from convalue.engine.features.losses import per_example_loss
from convalue.engine.model.loading import autocast

if TYPE_CHECKING:
    import torch

    from convalue.engine.features.projection import Projector


class GroupTaskVectors:
    """Task vectors tau_i = theta_i - theta_0 over all LoRA parameters (A and B), paper Sec. 3.1.

    For each group: reset the adapter to its seeded initialisation (B = 0, so theta = theta_0),
    take `steps` AdamW steps on the group's preview alone (batches cycle through its examples in a
    fixed order; dropout off), read tau, and reset again, so no group sees another's updates.
    """

    def __init__(self, peft_model: torch.nn.Module, named_params: list[tuple[str, torch.nn.Parameter]],
                 projector: Projector, pad_id: int, *, steps: int, lr: float, batch_size: int, device: str = "cpu",
                 autocast_dtype: torch.dtype | None = None):
        self.model = peft_model.eval()
        self.autocast_dtype = autocast_dtype
        self.names = [n for n, _ in named_params]
        self.params = [p for _, p in named_params]
        self.init = [p.detach().clone() for p in self.params]
        self.projector = projector
        self.pad_id, self.steps, self.lr, self.batch_size, self.device = pad_id, steps, lr, batch_size, device
        self.tokens = 0
        self.seconds = 0.0

    @property
    def dim(self) -> int:
        """d: number of LoRA parameters."""
        return sum(p.numel() for p in self.params)

    def _reset(self) -> None:
        # torch: only on a worker that runs the model; the driver imports this module without it
        import torch

        with torch.no_grad():
            for p, p0 in zip(self.params, self.init):
                p.copy_(p0)
                p.grad = None

    def raw_vector(self, examples: tuple[TokenizedExample, ...]) -> np.ndarray:
        """tau for one group (float32, length d)."""
        # torch: only on a worker that runs the model; the driver imports this module without it
        import torch

        if not examples:
            raise ValueError("cannot take the task vector of an empty group")
        t0 = time.perf_counter()
        self._reset()
        opt = torch.optim.AdamW(self.params, lr=self.lr, weight_decay=0.0)
        order = sorted(range(len(examples)), key=lambda i: len(examples[i]))
        for step in range(self.steps):
            start = (step * self.batch_size) % len(order)
            idx = [order[(start + j) % len(order)] for j in range(min(self.batch_size, len(order)))]
            ids, mask, labels = (t.to(self.device) for t in pad_batch([examples[i] for i in idx], self.pad_id))
            with autocast(self.device, self.autocast_dtype):
                loss = per_example_loss(self.model, ids, mask, labels).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            self.tokens += int(mask.sum())
        tau = torch.cat([(p.detach() - p0).float().reshape(-1) for p, p0 in zip(self.params, self.init)])
        self._reset()
        self.seconds += time.perf_counter() - t0
        return tau.cpu().numpy()

    def featurize(self, items: list[WorkItem]) -> np.ndarray:
        """Projected task vectors of several groups: a [len(items), p] float32 block."""
        return self.projector.project(np.stack([self.raw_vector(it.examples) for it in items]))
