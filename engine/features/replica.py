"""One worker's replica: theta_0, the featurised parameters and the featuriser the config asks for (Ray-free)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from convalue.engine.config import FeaturesConfig, LoraConfig
from convalue.engine.features.gradients import GroupGradients
from convalue.engine.features.grpo import GroupGrpoGradients
from convalue.engine.features.projection import make_projector
from convalue.engine.features.task_vectors import GroupTaskVectors
from convalue.engine.model.loading import (
    attach_lora,
    autocast_dtype,
    load_model,
    load_tokenizer,
    lora_b_parameters,
)
from convalue.engine.model.spec import ReplicaSpec

if TYPE_CHECKING:
    import torch

# model.split_cost_tokens on CPU workers (null): there a forward call costs little beside its padded tokens, so
# cutting a packed batch into length runs pays; a cut must save this many padded tokens, since cutting at every
# distinct length (0) adds more calls than the padding it saves
CPU_SPLIT_COST_TOKENS = 32


def featurised_parameters(model: torch.nn.Module, features: FeaturesConfig,
                          lora: LoraConfig) -> tuple[torch.nn.Module, list[tuple[str, torch.nn.Parameter]]]:
    """(model to run, [(name, parameter)] to featurise, in a fixed order) with requires_grad set to match.

    `lora`: a seeded adapter (B = 0, so theta = theta_0); lora_B only for gradients (at B = 0 lora_A's gradient
    is exactly 0, so it is never computed or stored), lora_A and lora_B for task vectors. `full`: every
    base-model weight (tied weights once), no adapter.
    """
    if features.parameters == "full":
        named = list(model.named_parameters())  # named_parameters() yields a tied weight once
        for _, p in named:
            p.requires_grad_(True)
        return model, named
    peft_model = attach_lora(model, lora, dropout=0.0)
    task_vector = features.representation == "task_vector"
    named = lora_b_parameters(peft_model, with_a=task_vector)
    chosen = {id(p) for _, p in named}
    for _, p in peft_model.named_parameters():
        p.requires_grad_(id(p) in chosen)
    return peft_model, named


def build_featurizer(spec: ReplicaSpec) -> GroupGradients | GroupTaskVectors | GroupGrpoGradients:
    """The featuriser for a replica spec: one of GroupGradients, GroupTaskVectors or GroupGrpoGradients, with its
    model replica and projector."""
    device, features, proj, mc = spec.device, spec.features, spec.projection, spec.model
    model = load_model(Path(spec.model_dir), mc.dtype, device)
    model, named = featurised_parameters(model, features, spec.lora)
    params = [p for _, p in named]
    projector = make_projector(proj.kind, sum(p.numel() for p in params), proj.dim, proj.seed)
    amp_dtype = autocast_dtype(device, mc.dtype)
    if features.representation == "task_vector":
        steps = features.tv_steps or max(1, round(features.tv_fraction * spec.finetune.steps))
        return GroupTaskVectors(model, named, projector, spec.pad_id, steps=steps,
                                lr=features.tv_lr, batch_size=features.tv_batch_size, device=device,
                                autocast_dtype=amp_dtype)
    if features.representation == "grpo":
        return GroupGrpoGradients(model, params, projector, load_tokenizer(Path(spec.model_dir)),
                                  reward=features.grpo_reward, generations=features.grpo_generations,
                                  max_new_tokens=features.grpo_max_new_tokens, temperature=features.grpo_temperature,
                                  top_p=features.grpo_top_p, kl_coef=features.grpo_kl_coef, seed=features.grpo_seed,
                                  max_length=mc.max_length, device=device, autocast_dtype=amp_dtype)
    # per-example hooks exist for LoRA's lora_B only; full-parameter gradients go one group at a time
    packed = mc.token_budget if features.parameters == "lora" else None
    split = mc.split_cost_tokens
    if split is None and not device.startswith("cuda"):
        split = CPU_SPLIT_COST_TOKENS
    return GroupGradients(model, params, projector, spec.pad_id, mc.batch_size, device, amp_dtype,
                          param_names=[n for n, _ in named], token_budget=packed,
                          keep_per_example=features.keep_per_example, split_cost_tokens=split)
