"""Fine-tune jobs as Ray tasks: one fresh replica per job, LoRA on target + selection, validation loss."""

from __future__ import annotations

import ray

from engine.config import FinetuneConfig, LoraConfig
from engine.finetune import FinetuneResult, evaluate_loss, finetune
from engine.tokenize import TokenizedExample


def run_finetune_job(spec: dict, label: str, target: list[TokenizedExample],
                     aux: dict[str, list[TokenizedExample]], val: list[TokenizedExample],
                     with_base: bool) -> FinetuneResult:
    """Load theta_0, optionally evaluate it, then fine-tune and evaluate (one job)."""
    import torch

    from engine.models import autocast_dtype, load_model

    torch.set_num_threads(int(spec["threads"]))
    torch.manual_seed(spec["finetune"]["seed"])
    device = spec.get("device", "cpu")
    model = load_model(spec["model_dir"], spec["dtype"], device)
    cfg = FinetuneConfig(**spec["finetune"])
    amp_dtype = autocast_dtype(device, spec["dtype"])
    base = evaluate_loss(model, val, cfg.eval_batch_size, spec["pad_id"], device, amp_dtype) if with_base else None
    return finetune(model, spec["pad_id"], cfg, LoraConfig(**spec["lora"]), label=label, target=target,
                    aux=aux, val=val, base_val_loss=base, device=device, autocast_dtype=amp_dtype)


def run_base_eval(spec: dict, val: list[TokenizedExample]) -> float:
    """The base model's validation loss alone (when every fine-tune was already stored)."""
    import torch

    from engine.models import autocast_dtype, load_model

    torch.set_num_threads(int(spec["threads"]))
    device = spec.get("device", "cpu")
    model = load_model(spec["model_dir"], spec["dtype"], device)
    return evaluate_loss(model, val, spec["finetune"]["eval_batch_size"], spec["pad_id"], device,
                         autocast_dtype(device, spec["dtype"]))


finetune_task = ray.remote(max_retries=1)(run_finetune_job)
base_eval_task = ray.remote(max_retries=1)(run_base_eval)
