"""GradientWorker: a Ray actor holding one model replica + LoRA adapter + projector."""

from __future__ import annotations

import os
import time

import numpy as np
import ray

from engine.config import FeaturesConfig, LoraConfig, ProjectionConfig
from engine.featurize import GroupGradients, GroupTaskVectors, WorkItem


class GradientWorkerImpl:
    """Loads theta_0 with a seeded LoRA adapter once; returns projected mean gradients of groups."""

    def __init__(self, spec: dict):
        import torch

        from engine.models import attach_lora, load_model, lora_b_parameters
        from engine.projection import make_projector

        torch.set_num_threads(int(spec["threads"]))
        t0 = time.perf_counter()
        device = spec.get("device", "cpu")
        model = load_model(spec["model_dir"], spec["dtype"], device)
        lora = LoraConfig(**spec["lora"])
        peft_model = attach_lora(model, lora, dropout=0.0)
        features = FeaturesConfig(**spec.get("features", {}))
        proj = ProjectionConfig(**spec["projection"])
        task_vector = features.representation == "task_vector"
        named = lora_b_parameters(peft_model, with_a=task_vector)
        params = [p for _, p in named]
        projector = make_projector(proj.kind, sum(p.numel() for p in params), proj.dim, proj.seed)
        if task_vector:
            self.grads = GroupTaskVectors(peft_model, named, projector, spec["pad_id"], steps=features.tv_steps,
                                          lr=features.tv_lr, batch_size=features.tv_batch_size, device=device)
        else:
            for n, p in peft_model.named_parameters():
                p.requires_grad_("lora_B" in n)  # lora_A's gradient is exactly 0 at B = 0: never computed or stored
            autocast = torch.bfloat16 if (device.startswith("cuda") and spec["dtype"] == "bfloat16") else None
            self.grads = GroupGradients(peft_model, params, projector, spec["pad_id"], spec["batch_size"],
                                        device, autocast, param_names=[n for n, _ in named],
                                        token_budget=spec.get("token_budget"))
        self.load_seconds = time.perf_counter() - t0

    def info(self) -> dict:
        """Dimensions and identity of this replica."""
        return {"pid": os.getpid(), "dim_in": self.grads.dim, "dim_out": self.grads.projector.dim_out,
                "load_seconds": self.load_seconds}

    def featurize(self, items: list[WorkItem]) -> tuple[list[str], np.ndarray, dict]:
        """(names, [len(items), p] block, stats) for one block of groups."""
        tokens0, sec0 = self.grads.tokens, self.grads.seconds
        block = self.grads.featurize(items)
        return [it.name for it in items], block, {"tokens": self.grads.tokens - tokens0,
                                                  "seconds": self.grads.seconds - sec0, "pid": os.getpid()}


# Gradient calls are pure functions of (model, group): retrying them is safe (at-least-once),
# and a restarted actor rebuilds its replica from the model path.
GradientWorker = ray.remote(max_restarts=2, max_task_retries=2)(GradientWorkerImpl)
