"""Fine-tunes beyond one device (finetune.strategy `deepspeed`): the job message, the DeepSpeed/ZeRO config and the
per-worker training function, with no Ray in it (actors/train_job.py launches it as a Ray Train TorchTrainer).

The training is paper Alg. 1 as engine/protocol/finetune.py runs it, data-parallel over the job's workers: the same
T steps, the same Bernoulli(rho) target/auxiliary draws (`mixing_schedule`), the same batch of each step (drawn by
every worker from the same seeded stream, then split between them), the same mean per-example loss, LoRA adapter,
AdamW, cosine schedule, clipping and validation loss. Each worker's loss is its share of the batch's sum scaled by
world/batch, so DeepSpeed's average of the workers' gradients is exactly the single process's batch-mean gradient.

The job may fine-tune another model than the valuation model (value with a small model, fine-tune a larger one):
so it receives raw examples and tokenises them with its own model's tokenizer, keeping those with response tokens
left after truncation (as engine/data/prepare.py and the driver do for the valuation model).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from convalue.engine.config import FinetuneConfig, LoraConfig
from convalue.engine.data.examples import Example
from convalue.engine.data.tokenize import TokenizedExample, tokenize_examples
from convalue.engine.features.batching import pad_batch
from convalue.engine.features.losses import per_example_loss
from convalue.engine.model.loading import (
    attach_lora,
    autocast,
    autocast_dtype,
    load_tokenizer,
    torch_dtype,
)
from convalue.engine.protocol.finetune import FinetuneResult, mixing_schedule

if TYPE_CHECKING:
    import torch

#: ZeRO stages: 0 (DeepSpeed's data parallelism alone), 1 (optimizer states partitioned), 2 (+ gradients),
#: 3 (+ parameters: a model larger than one device's memory)
ZERO_STAGES = (0, 1, 2, 3)
OFFLOAD_DEVICES = ("none", "cpu")
#: torch.optim.AdamW's defaults (what finetune.py trains with), spelt out for DeepSpeed's own optimizer (offload)
ADAMW = {"betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.01}


@dataclass(frozen=True)
class ZeroSettings:
    """How one fine-tune job is spread: Ray Train workers (one process, and with GPUs one device, each) and the
    DeepSpeed ZeRO stage and offloads (the fields of the finetune.deepspeed config section)."""

    workers: int = 2
    use_gpu: bool = True
    cpus_per_worker: int = 1
    stage: int = 2
    offload_optimizer: str = "none"
    offload_param: str = "none"

    def __post_init__(self) -> None:
        if isinstance(self.stage, bool) or self.stage not in ZERO_STAGES:
            raise ValueError(f"ZeRO stage must be one of {ZERO_STAGES}, got {self.stage!r}")
        if self.workers < 1 or self.cpus_per_worker < 1:
            raise ValueError(f"workers and cpus_per_worker must be >= 1, got {self.workers}, {self.cpus_per_worker}")
        for name in ("offload_optimizer", "offload_param"):
            if getattr(self, name) not in OFFLOAD_DEVICES:
                raise ValueError(f"{name} must be one of {OFFLOAD_DEVICES}, got {getattr(self, name)!r}")
        if self.offload_optimizer != "none" and self.stage == 0:
            raise ValueError("offload_optimizer needs ZeRO stage 1, 2 or 3")
        if self.offload_param != "none" and self.stage != 3:
            raise ValueError("offload_param needs ZeRO stage 3 (only stage 3 partitions the parameters)")

    @property
    def backend(self) -> str:
        """The torch.distributed backend: NCCL between GPUs, gloo between CPU processes."""
        return "nccl" if self.use_gpu else "gloo"

    @classmethod
    def from_config(cls, section: Any) -> ZeroSettings:
        """From the finetune.deepspeed config section (any object with these fields)."""
        return cls(**{f.name: getattr(section, f.name) for f in dataclasses.fields(cls)})


@dataclass(frozen=True)
class TrainJobSpec:
    """What every worker of a fine-tune job builds its replica from: the fine-tune model's folder (resolved, like
    model.source, by engine.model.loading.resolve_model_dir) and dtype, the context length its tokenizer cuts at,
    the finetune and LoRA sections (with the job's seed and rho), how the job is spread, and torch threads."""

    model_dir: str
    dtype: str
    max_length: int
    finetune: FinetuneConfig
    lora: LoraConfig
    zero: ZeroSettings
    threads: int = 1
    model_digest: str = ""  # the content hash of model_dir (engine.model.digest), for the fine-tune store's key

    def for_job(self, seed: int, rho: float | None = None) -> TrainJobSpec:
        """The spec of one fine-tune job: the finetune section with its seed (and its rho_k where it has one)."""
        changes: dict[str, Any] = {"seed": seed} | ({} if rho is None else {"rho": rho})
        return dataclasses.replace(self, finetune=dataclasses.replace(self.finetune, **changes))


@dataclass(frozen=True)
class TrainJob:
    """One fine-tune job (the message a Ray Train worker receives): raw chat examples of the target's train and
    validation splits and of each bought auxiliary group, tokenised in the job by the fine-tune model's tokenizer.

    weights: the mixture weight of each auxiliary group (None: drawn uniformly); with_base: also evaluate the base
    model's validation loss; base_only: evaluate that alone, no training (the driver's base evaluation when every
    fine-tune was stored already)."""

    spec: TrainJobSpec
    label: str
    target: tuple[Example, ...]
    aux: dict[str, tuple[Example, ...]]
    val: tuple[Example, ...]
    weights: dict[str, float] | None = None
    with_base: bool = False
    base_only: bool = False

    def __post_init__(self) -> None:
        if not self.target:
            raise ValueError("fine-tune needs target training examples")
        if not self.val:
            raise ValueError("fine-tune needs target validation examples")
        if self.weights is not None and set(self.weights) != set(self.aux):
            raise ValueError(f"mixture weights for {sorted(self.weights)}, but the auxiliary groups are "
                             f"{sorted(self.aux)}")


# --- the draws and batches of finetune.py, which its loop inlines (to move there: step_plan, batch_draws, eval_batches) ---

def step_plan(cfg: FinetuneConfig, names: list[str], weights: dict[str, float] | None) -> list[int]:
    """Per step: -1 (a target batch) or the index of the auxiliary group in `names` (sorted), as finetune() draws."""
    if weights is not None and set(weights) != set(names):
        raise ValueError(f"mixture weights for {sorted(weights)}, but the auxiliary groups are {names}")
    return mixing_schedule(cfg.steps, cfg.rho, len(names), cfg.seed,
                           None if weights is None else [weights[n] for n in names])


def batch_draws(plan: list[int], sizes: dict[int, int], batch_size: int, seed: int) -> Iterator[np.ndarray]:
    """The example indices of each step's batch in its pool (sizes: pool size by plan entry), as finetune() draws:
    min(batch_size, pool size) without replacement from one stream seeded [seed, 0xB2]."""
    rng = np.random.default_rng([seed, 0xB2])
    for src in plan:
        n = sizes[src]
        yield rng.choice(n, size=min(batch_size, n), replace=False)


def eval_batches(examples: Sequence[TokenizedExample], batch_size: int) -> list[list[TokenizedExample]]:
    """evaluate_loss's batches: the examples sorted by length, cut into batch_size runs."""
    order = sorted(range(len(examples)), key=lambda i: len(examples[i]))
    return [[examples[i] for i in order[s : s + batch_size]] for s in range(0, len(order), batch_size)]


def shard(items: Sequence, rank: int, world: int) -> list:
    """This worker's share of a step's batch (or of the validation batches): every world-th, from rank."""
    return list(items[rank::world])


# --- the DeepSpeed config ---

def deepspeed_config(zero: ZeroSettings, cfg: FinetuneConfig) -> dict:
    """The DeepSpeed config of a job: ZeRO stage and offloads, gradient clipping at cfg.max_grad_norm, one
    micro-batch per step (no accumulation; the loss is scaled by hand, see `worker_loss`), fp32 optimizer states
    (the model's dtype and bf16 autocast are those of finetune.py). With the optimizer offloaded, DeepSpeed's CPU
    AdamW (built with the job's first step) with torch.optim.AdamW's defaults; otherwise the job passes
    torch.optim.AdamW itself."""
    micro = max(1, math.ceil(cfg.batch_size / zero.workers))
    zopt: dict[str, Any] = {"stage": zero.stage}
    if zero.offload_optimizer != "none":
        zopt["offload_optimizer"] = {"device": zero.offload_optimizer, "pin_memory": zero.use_gpu}
    if zero.offload_param != "none":
        zopt["offload_param"] = {"device": zero.offload_param, "pin_memory": zero.use_gpu}
    if zero.stage == 3:
        # the weights are gathered for saving never (the job keeps no checkpoint): no 16-bit gather at the end
        zopt["stage3_gather_16bit_weights_on_model_save"] = False
    out: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": cfg.max_grad_norm,
        "zero_optimization": zopt,
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
    if zero.offload_optimizer != "none":
        out["optimizer"] = {"type": "AdamW", "params": {"lr": cfg.lr, **ADAMW}}
    return out


def worker_loss(losses: torch.Tensor, batch: int, world: int) -> torch.Tensor:
    """This worker's share of the step's loss: the sum of its examples' losses times world/batch, so that the
    average DeepSpeed takes of the workers' gradients is the gradient of the batch's mean loss."""
    return losses.sum() * (world / batch)


# --- the per-worker training function ---

def tokenize_job(tokenizer, job: TrainJob) -> tuple[list[TokenizedExample], dict[str, list[TokenizedExample]],
                                                    list[TokenizedExample]]:
    """(target, aux, val) tokenised by the fine-tune model's tokenizer, each example with response tokens only."""
    def usable(examples: Sequence[Example]) -> list[TokenizedExample]:
        return [t for t in tokenize_examples(tokenizer, list(examples), job.spec.max_length) if t.n_response > 0]

    target, val = usable(job.target), usable(job.val)
    aux = {n: usable(ex) for n, ex in job.aux.items()}
    for what, toks in [("target train", target), ("target validation", val), *aux.items()]:
        if not toks:
            raise ValueError(f"{what}: no example keeps response tokens after tokenising with the fine-tune "
                             f"model's tokenizer at max_length {job.spec.max_length}")
    return target, aux, val


def _distributed(zero: ZeroSettings, device: str | None) -> tuple[int, int, str]:
    """(rank, world size, device) after joining the job's process group (Ray Train made it; else from the
    torch.distributed environment variables). device: this worker's GPU where the launcher knows it (Ray Train's
    get_device()), else cuda:LOCAL_RANK (with use_gpu) or the CPU."""
    # deepspeed (an optional extra) and torch: only inside a deepspeed fine-tune's workers
    import deepspeed
    import torch
    import torch.distributed as dist
    from deepspeed.accelerator import get_accelerator

    deepspeed.init_distributed(dist_backend=zero.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    if not zero.use_gpu:
        return rank, world, "cpu"
    index = torch.device(device).index if device else int(os.environ.get("LOCAL_RANK", "0"))
    get_accelerator().set_device(index)
    return rank, world, get_accelerator().device_name(index)


def _load(spec: TrainJobSpec, ds_config: dict, device: str) -> tuple[Any, Any]:
    """(theta_0 of the fine-tune model, what must outlive it). Under ZeRO-3 the model is built partitioned
    (transformers' zero.Init integration, while a HfDeepSpeedConfig is alive), so no worker ever holds all of it."""
    # torch: only on a worker that runs the model; the driver imports this module without it
    import torch
    from transformers import AutoModelForCausalLM

    if spec.zero.stage == 3:
        # transformers' DeepSpeed integration: only for ZeRO-3
        from transformers.integrations import HfDeepSpeedConfig

        # zero.Init builds the parameters in the dtype its config names (fp32 unless bf16 is on): name the model's
        # dtype there only; the engine's config keeps fp32 optimizer states, as finetune.py does
        load_config = ds_config | ({"bf16": {"enabled": True}} if spec.dtype == "bfloat16" else {})
        keep = HfDeepSpeedConfig(load_config)  # transformers holds a weak reference: keep it for the job's length
        model = AutoModelForCausalLM.from_pretrained(spec.model_dir, dtype=torch_dtype(spec.dtype))
        return model.eval(), keep
    model = AutoModelForCausalLM.from_pretrained(spec.model_dir, dtype=torch_dtype(spec.dtype))
    return model.to(torch.device(device)).eval(), None


def _eval_sum(model, batches: list[tuple[bool, list[TokenizedExample]]], pad_id: int, device: str, amp) -> float:
    """Sum of the per-example losses of the (counted, batch) pairs whose flag is set; an uncounted batch is a forward
    whose result is dropped, so that every worker makes as many forwards as the others (ZeRO-3 gathers each
    layer's weights collectively)."""
    # torch: only on a worker that runs the model; the driver imports this module without it
    import torch

    total = 0.0
    with torch.no_grad(), autocast(device, amp):
        for counted, batch in batches:
            ids, mask, labels = (t.to(device) for t in pad_batch(batch, pad_id))
            losses = per_example_loss(model, ids, mask, labels)
            if counted:
                total += float(losses.sum())
    return total


def distributed_eval(model, val: list[TokenizedExample], batch_size: int, pad_id: int, device: str, amp,
                     rank: int, world: int) -> float:
    """evaluate_loss over the workers: its batches dealt out in turn, the same number of forwards on each worker,
    the per-example losses summed over all of them (one worker: evaluate_loss's very sums)."""
    # torch: only on a worker that runs the model; the driver imports this module without it
    import torch
    import torch.distributed as dist

    model.eval()
    batches = eval_batches(val, batch_size)
    rounds = math.ceil(len(batches) / world)
    mine = [(True, b) for b in shard(batches, rank, world)]
    mine += [(False, batches[0])] * (rounds - len(mine))
    total = torch.tensor([_eval_sum(model, mine, pad_id, device, amp)], dtype=torch.float64, device=device)
    if world > 1:
        dist.all_reduce(total)
    return float(total.item()) / len(val)


def train_worker(job: TrainJob, device: str | None = None) -> dict:
    """One worker of a fine-tune job (Ray Train's train_loop_per_worker calls it; so can torchrun or the deepspeed
    launcher): tokenise, load theta_0, attach the LoRA adapter, train cfg.steps data-parallel steps under
    DeepSpeed, evaluate. device: this worker's GPU, where the launcher knows it.

    Returns FinetuneResult's fields, `train_losses` (every step's batch-mean loss, the same on every worker),
    `world_size`, `zero_stage` and `partitioned_at_load` (ZeRO-3: the base weights were partitioned as loaded);
    with job.base_only, base_val_loss, world_size and zero_stage alone."""
    spec, cfg = job.spec, job.spec.finetune
    os.environ.setdefault("DS_ACCELERATOR", "cuda" if spec.zero.use_gpu else "cpu")
    # deepspeed (an optional extra), torch and transformers: only inside a deepspeed fine-tune's workers
    import deepspeed
    import torch
    import torch.distributed as dist
    from transformers import get_cosine_schedule_with_warmup

    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    t0 = time.perf_counter()
    torch.set_num_threads(spec.threads)
    torch.manual_seed(cfg.seed)
    rank, world, device = _distributed(spec.zero, device)
    tokenizer = load_tokenizer(spec.model_dir)
    target, aux, val = tokenize_job(tokenizer, job)
    pad_id = tokenizer.pad_token_id
    names = sorted(aux)
    plan = step_plan(cfg, names, job.weights)
    pools = {-1: target} | {i: aux[n] for i, n in enumerate(names)}
    ds_config = deepspeed_config(spec.zero, cfg)
    amp = autocast_dtype(device, spec.dtype)

    model, keep = _load(spec, ds_config, device)
    partitioned = any(hasattr(p, "ds_id") for p in model.parameters())
    peft_model = attach_lora(model, spec.lora)
    params = [p for p in peft_model.parameters() if p.requires_grad]
    steps = cfg.steps

    def schedule(opt):
        return get_cosine_schedule_with_warmup(opt, max(1, math.ceil(0.03 * steps)), steps)

    optimizer = None if spec.zero.offload_optimizer != "none" else torch.optim.AdamW(params, lr=cfg.lr)
    engine, _, _, _ = deepspeed.initialize(model=peft_model, model_parameters=params, optimizer=optimizer,
                                           lr_scheduler=schedule, config=ds_config)
    # the adapter starts with B = 0, so before the first step the model is theta_0 exactly
    base = (distributed_eval(engine.module, val, cfg.eval_batch_size, pad_id, device, amp, rank, world)
            if job.with_base or job.base_only else None)
    if job.base_only:
        engine.destroy()
        return {"base_val_loss": base, "world_size": world, "zero_stage": spec.zero.stage}
    sums = []
    engine.train()
    for src, idx in zip(plan, batch_draws(plan, {k: len(v) for k, v in pools.items()}, cfg.batch_size, cfg.seed)):
        pool, mine = pools[src], shard(idx, rank, world)
        # a worker with no example this step (a pool smaller than the workers) still joins the collectives
        ids, mask, labels = (t.to(device) for t in pad_batch([pool[i] for i in (mine or idx[:1])], pad_id))
        with autocast(device, amp):
            losses = per_example_loss(engine.module, ids, mask, labels)
        loss = worker_loss(losses, len(idx), world) * (1.0 if mine else 0.0)
        engine.backward(loss)
        engine.step()
        sums.append(float(losses.detach().sum()) if mine else 0.0)
    totals = torch.tensor(sums, dtype=torch.float64, device=device)
    if world > 1:
        dist.all_reduce(totals)
    batch_sizes = [min(cfg.batch_size, len(pools[src])) for src in plan]
    train_losses = [float(t) / b for t, b in zip(totals.tolist(), batch_sizes)]
    val_loss = distributed_eval(engine.module, val, cfg.eval_batch_size, pad_id, device, amp, rank, world)
    result = FinetuneResult(
        label=job.label, groups=names, steps=steps, target_steps=sum(1 for s in plan if s < 0),
        aux_steps=sum(1 for s in plan if s >= 0), val_loss=val_loss, base_val_loss=base,
        first_train_loss=train_losses[0], last_train_loss=train_losses[-1], seconds=time.perf_counter() - t0)
    engine.destroy()
    del keep
    return result.to_dict() | {"train_losses": train_losses, "world_size": world, "zero_stage": spec.zero.stage,
                               "partitioned_at_load": partitioned}
