"""One worker's replica: theta_0, the featurised parameters and the featuriser the config asks for (Ray-free)."""

from __future__ import annotations

from pathlib import Path

from convalue.engine.config.sections import FeaturesConfig, LoraConfig, ProjectionConfig

# model.split_cost_tokens on CPU workers (null): bench/length_runs.py measures it against no cuts (1.05-1.11x);
# 96 timed about the same as 32, and 0 (a forward per distinct length) slower than no cuts
CPU_SPLIT_COST_TOKENS = 32


def featurised_parameters(model, features: FeaturesConfig, lora: LoraConfig) -> tuple[object, list[tuple[str, object]]]:
    """(model to run, [(name, parameter)] to featurise, in a fixed order) with requires_grad set to match.

    `lora`: a seeded adapter (B = 0, so theta = theta_0); lora_B only for gradients (at B = 0 lora_A's gradient
    is exactly 0, so it is never computed or stored), lora_A and lora_B for task vectors. `full`: every
    base-model weight (tied weights once), no adapter.
    """
    from convalue.engine.model.loading import attach_lora, lora_b_parameters

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


def build_featurizer(spec: dict):
    """The featuriser for a worker spec (see convalue.engine.driver.pipeline._worker_spec): one of GroupGradients,
    GroupTaskVectors or GroupGrpoGradients, with its model replica and projector."""
    from convalue.engine.features.gradients import GroupGradients, GroupTaskVectors
    from convalue.engine.features.grpo import GroupGrpoGradients
    from convalue.engine.features.projection import make_projector
    from convalue.engine.model.loading import autocast_dtype, load_model, load_tokenizer

    device = spec.get("device", "cpu")
    features = FeaturesConfig(**spec.get("features", {}))
    proj = ProjectionConfig(**spec["projection"])
    model = load_model(Path(spec["model_dir"]), spec["dtype"], device)
    model, named = featurised_parameters(model, features, LoraConfig(**spec["lora"]))
    params = [p for _, p in named]
    projector = make_projector(proj.kind, sum(p.numel() for p in params), proj.dim, proj.seed)
    amp_dtype = autocast_dtype(device, spec["dtype"])
    if features.representation == "task_vector":
        return GroupTaskVectors(model, named, projector, spec["pad_id"], steps=features.tv_steps,
                                lr=features.tv_lr, batch_size=features.tv_batch_size, device=device,
                                autocast_dtype=amp_dtype)
    if features.representation == "grpo":
        return GroupGrpoGradients(model, params, projector, load_tokenizer(Path(spec["model_dir"])),
                                  reward=features.grpo_reward, generations=features.grpo_generations,
                                  max_new_tokens=features.grpo_max_new_tokens, temperature=features.grpo_temperature,
                                  top_p=features.grpo_top_p, kl_coef=features.grpo_kl_coef, seed=features.grpo_seed,
                                  max_length=spec["max_length"], device=device, autocast_dtype=amp_dtype)
    # per-example hooks exist for LoRA's lora_B only; full-parameter gradients go one group at a time
    packed = spec.get("token_budget") if features.parameters == "lora" else None
    split = spec.get("split_cost_tokens")
    if split is None and not device.startswith("cuda"):
        split = CPU_SPLIT_COST_TOKENS
    return GroupGradients(model, params, projector, spec["pad_id"], spec["batch_size"], device, amp_dtype,
                          param_names=[n for n, _ in named], token_budget=packed,
                          keep_per_example=features.keep_per_example, split_cost_tokens=split)
