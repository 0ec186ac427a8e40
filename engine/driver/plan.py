"""`convalue run --dry-run`: what a run would do and cost, without starting Ray: the config checked, the model and
its LoRA targets checked, the groups resolved and their previews tokenised, the fine-tunes counted, and the time
estimated from a forward and backward pass measured on this machine."""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from pathlib import Path

from convalue.engine.config import RunConfig
from convalue.engine.data.costs import load_costs
from convalue.engine.data.prepare import prepare
from convalue.engine.data.sources import load_source
from convalue.engine.driver.baselines import FITTED
from convalue.engine.driver.stages import TAGS, check_budgets
from convalue.engine.model.loading import check_lora_targets_in, load_tokenizer, resolve_model
from convalue.engine.protocol.evaluate import BASELINE_METHODS


@dataclass(frozen=True)
class RunPlan:
    """The work a run would do, and its estimated cost."""

    model_dir: str
    target: str
    target_train: int
    target_val: int
    candidates: int
    clustered_pools: list[str]
    preview_tokens: int
    workers: int
    blocks: int
    methods: list[str]
    ks: list[int]
    seeds: list[int]
    fine_tunes: int
    fine_tune_tokens: int
    tokens_per_second: float | None
    featurize_seconds: float | None
    finetune_seconds: float | None
    warnings: list[str]


def _measure_tokens_per_second(model_dir: Path, cfg: RunConfig, length: int) -> float:
    """Tokens per second of one LoRA forward and backward pass on this machine, with the run's worker threads."""
    import torch

    from convalue.engine.model.loading import attach_lora, load_model

    torch.set_num_threads(cfg.ray.cpus_per_worker)
    model = attach_lora(load_model(model_dir, cfg.model.dtype, "cpu"), cfg.lora, dropout=0.0)
    rows = max(1, (cfg.model.token_budget or cfg.model.batch_size * length) // max(length, 1))
    ids = torch.randint(0, model.config.vocab_size, (rows, length))
    model(input_ids=ids, labels=ids).loss.backward()  # warm-up: first-call allocations
    t0 = time.perf_counter()
    model(input_ids=ids, labels=ids).loss.backward()
    return rows * length / (time.perf_counter() - t0)


def make_plan(cfg: RunConfig, measure: bool = True) -> RunPlan:
    """The plan of cfg (no Ray): a flat pool is counted, not embedded and clustered, so its groups are estimated."""
    model_dir = resolve_model(cfg.model).dir
    tokenizer = load_tokenizer(model_dir)
    if cfg.features.parameters == "lora":
        check_lora_targets_in(model_dir, cfg.lora)
    pools = [s for s in cfg.data.candidates if s.clusters is not None]
    data_cfg = dataclasses.replace(cfg.data, candidates=[dataclasses.replace(s, clusters=None)
                                                         for s in cfg.data.candidates], small_groups="keep")
    data = prepare(data_cfg, tokenizer, cfg.model.max_length, grpo=cfg.features.representation == "grpo")
    lengths = [len(e) for it in [data.target_item, *data.items] for e in it.examples]
    mean_len = sum(lengths) / max(len(lengths), 1)
    n = (len(data.items) if not pools else
         sum(len(load_source(s)) for s in cfg.data.candidates if s.clusters is None) + sum(s.clusters for s in pools))
    check_budgets(cfg, n)  # a flat pool's n is its clusters' count: an upper bound
    if cfg.solver.costs_file and not pools:
        load_costs(cfg.solver.costs_file, data.names())
    preview = int(sum(lengths) if not pools else mean_len * (n + 1) * cfg.data.preview_size)
    reps = cfg.features.representations or [cfg.features.representation]
    rep_methods = [] if len(reps) < 2 else [TAGS[reps[0]]] + [m for r in reps[1:] for m in (TAGS[r], f"{TAGS[r]}+kmm")]
    fitted = [b for b in cfg.finetune.baselines if b in FITTED]
    methods = (["kmm"] + [b for b in cfg.finetune.baselines if b in BASELINE_METHODS] + rep_methods + fitted
               + (["kmm_path"] if cfg.solver.path else []))
    ks, seeds = cfg.evaluation_ks(), cfg.finetune.seeds()
    cells = (len(methods) * len(ks) + ("target_only" in cfg.finetune.baselines)) * len(seeds)
    dm = cfg.finetune.datamodel
    extra = sum(round(dm.runs_per_candidate * n) + 1 for b in fitted if b.startswith("datamodel"))
    extra += 1 if any(b.startswith("gradex") for b in fitted) else 0  # theta*
    fine_tunes = cells + extra if cfg.finetune.enabled else 0
    ft_tokens = int(fine_tunes * cfg.finetune.steps * cfg.finetune.batch_size * mean_len)
    if "task_vector" in reps:  # a short fine-tune per group
        tv = cfg.features.tv_steps or max(1, round(cfg.features.tv_fraction * cfg.finetune.steps))
        preview += int((n + 1) * tv * cfg.features.tv_batch_size * mean_len)
    tps = _measure_tokens_per_second(model_dir, cfg, max(8, round(mean_len))) if measure else None
    workers = max(1, min(cfg.ray.workers, math.ceil(n / cfg.ray.groups_per_call)))
    feat_s = preview / (tps * workers) if tps else None
    ft_s = ft_tokens / (tps * min(cfg.ray.workers, max(fine_tunes, 1))) if tps and fine_tunes else (0.0 if tps else None)
    return RunPlan(model_dir=str(model_dir), target=data.target.name, target_train=len(data.target_train),
                   target_val=len(data.target_val), candidates=n, clustered_pools=[_stem(s) for s in pools],
                   preview_tokens=preview, workers=workers, blocks=math.ceil(n / cfg.ray.groups_per_call),
                   methods=methods, ks=ks, seeds=seeds, fine_tunes=fine_tunes, fine_tune_tokens=ft_tokens,
                   tokens_per_second=tps, featurize_seconds=feat_s, finetune_seconds=ft_s, warnings=data.warnings)


def _stem(src) -> str:
    """The group-name prefix of a flat pool's clusters."""
    return Path(src.path).stem if src.path else src.kind


def format_plan(plan: RunPlan, cfg: RunConfig) -> str:
    """The plan as a few lines for a person."""
    def est(s: float | None) -> str:
        return "not measured" if s is None else f"about {s / 60:.1f} min" if s >= 90 else f"about {s:.0f} s"

    lines = [f"plan for run {cfg.name!r} (nothing was started; outputs would go to {Path(cfg.out) / cfg.name})",
             f"model: {cfg.model.source} -> {plan.model_dir} (LoRA targets {cfg.lora.target_modules} found)",
             f"target: {plan.target} ({plan.target_train} train / {plan.target_val} validation examples)",
             f"candidates: {plan.candidates} groups" + (f" (flat pools {plan.clustered_pools} counted as their "
                                                         "clusters; embedding and k-means not run)"
                                                         if plan.clustered_pools else ""),
             f"featurise: {plan.preview_tokens:,} preview tokens ({cfg.features.representation}, projected to "
             f"p = {cfg.projection.dim}) on {plan.workers} worker(s) x {cfg.ray.cpus_per_worker} CPU, "
             f"{plan.blocks} blocks of {cfg.ray.groups_per_call}: {est(plan.featurize_seconds)}",
             f"solve: {cfg.solver.method} on a {plan.candidates} x {plan.candidates} Gram",
             f"fine-tunes: at most {plan.fine_tunes} ({len(plan.methods)} method(s) {plan.methods} x k in {plan.ks}"
             f"{' + target only' if 'target_only' in cfg.finetune.baselines else ''} x {len(plan.seeds)} seed(s), "
             "plus the fitted baselines' own; fewer where selections coincide), "
             f"{cfg.finetune.steps} steps each: {est(plan.finetune_seconds)}"]
    if plan.tokens_per_second is not None:
        lines.append(f"measured here: {plan.tokens_per_second:,.0f} tokens/s per worker (one LoRA forward and "
                     "backward); estimates leave out model loading, Ray start-up and packing gains")
    lines += [f"warning: {w}" for w in plan.warnings]
    return "\n".join(lines)
