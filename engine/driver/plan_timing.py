"""The dry run's time measurements and estimates: one LoRA forward and backward pass as featurisation packs it, and a
fine-tune job's parts as a job pays them (its imports once per worker, a fresh replica loaded per job, its steps
at the padded batch it trains on, its validation loss), each timed once on this machine."""

from __future__ import annotations

import math
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from convalue.engine.config import RunConfig

#: warm fine-tune steps and validation passes timed, their median kept (one pass can catch a busy moment)
REPEATS = 3
#: modules a fresh fine-tune worker imports before its first job (timed where this process has not imported them)
JOB_IMPORTS = ("torch", "transformers", "peft")


@dataclass(frozen=True)
class Timing:
    """What one fine-tune job and one featurisation pass cost on this machine, with the run's model and threads."""

    tokens_per_second: float  # featurisation: one packed LoRA forward and backward
    import_seconds: float  # a fresh worker's imports of torch, transformers and peft (0 where already imported)
    load_seconds: float  # a job's fresh replica: load the model and attach LoRA, plus its first step's extra cost
    step_seconds: float  # one fine-tune step: finetune.batch_size rows at the expected padded length, AdamW
    eval_tokens_per_second: float  # the validation loss: forward passes without gradients
    step_length: int  # the padded length the step was timed at


@dataclass(frozen=True)
class FinetuneEstimate:
    """The fine-tune stage's estimated wall time and its parts."""

    seconds: float
    job_seconds: float  # one job: load, steps, validation loss
    rounds: int  # jobs one after another on the busiest worker
    parallel: int  # jobs at once


def expected_padded_length(target: list[int], groups: list[list[int]], batch: int, rho: float, seed: int = 0) -> float:
    """The mean padded length of a fine-tune batch: the longest of `batch` examples drawn from the target (share
    rho of the steps) or from one candidate group (each alike), estimated from 256 seeded draws each."""
    rng = np.random.default_rng(seed)

    def mean_max(lengths: list[int]) -> float:
        if not lengths:
            return 0.0
        size = min(batch, len(lengths))
        return float(np.mean([max(rng.choice(lengths, size=size, replace=False)) for _ in range(256)]))

    aux = [mean_max(g) for g in groups if g]
    return rho * mean_max(target) + (1 - rho) * (float(np.mean(aux)) if aux else mean_max(target))


def _timed(call) -> float:
    t = time.perf_counter()
    call()
    return time.perf_counter() - t


def measure(model_dir: Path, cfg: RunConfig, feature_length: int, step_length: int) -> Timing:
    """Time, with the run's worker threads: the imports a fresh worker makes, loading a replica and attaching LoRA,
    a fine-tune step at step_length (cold once, warm the median of REPEATS), a packed featurisation pass at
    feature_length and a validation forward pass (the median of REPEATS)."""
    t0 = time.perf_counter()
    missing = [m for m in JOB_IMPORTS if m not in sys.modules]
    # heavy, and what is timed: torch, transformers and peft are imported only when a plan is measured
    import peft  # noqa: F401
    import torch

    from convalue.engine.model.loading import attach_lora, load_model

    import_s = time.perf_counter() - t0 if missing else 0.0
    torch.set_num_threads(cfg.ray.cpus_per_worker)
    t0 = time.perf_counter()
    model = attach_lora(load_model(model_dir, cfg.model.dtype, "cpu"), cfg.lora, dropout=0.0)
    load_s = time.perf_counter() - t0
    vocab = model.config.vocab_size
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.finetune.lr)

    def step() -> float:
        ids = torch.randint(0, vocab, (cfg.finetune.batch_size, step_length))
        t = time.perf_counter()
        model(input_ids=ids, labels=ids).loss.backward()
        torch.nn.utils.clip_grad_norm_(params, cfg.finetune.max_grad_norm)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return time.perf_counter() - t

    first = step()  # a job's first step pays its allocations
    warm = statistics.median(step() for _ in range(REPEATS))
    rows = max(1, (cfg.model.token_budget or cfg.model.batch_size * feature_length) // max(feature_length, 1))
    ids = torch.randint(0, vocab, (rows, feature_length))
    model(input_ids=ids, labels=ids).loss.backward()  # warm-up at this shape
    t0 = time.perf_counter()
    model(input_ids=ids, labels=ids).loss.backward()
    tps = rows * feature_length / (time.perf_counter() - t0)
    ids = torch.randint(0, vocab, (cfg.finetune.eval_batch_size, feature_length))
    with torch.no_grad():
        model(input_ids=ids)
        eval_tps = ids.numel() / statistics.median(_timed(lambda: model(input_ids=ids)) for _ in range(REPEATS))
    return Timing(tokens_per_second=tps, import_seconds=import_s, load_seconds=load_s + max(0.0, first - warm),
                  step_seconds=warm, eval_tokens_per_second=eval_tps, step_length=step_length)


def estimate_finetunes(timing: Timing, cfg: RunConfig, fine_tunes: int, val_tokens: int) -> FinetuneEstimate:
    """The fine-tune stage: each job loads a fresh replica, trains finetune.steps steps and evaluates the target's
    validation split; ray.workers jobs at once, so the busiest worker runs ceil(jobs / workers) of them after its
    imports; the first job also evaluates the base model. finetune.eval_every adds a curve's point (the loss on
    every evaluation) every eval_every steps."""
    if fine_tunes <= 0:
        return FinetuneEstimate(0.0, 0.0, 0, 0)
    val_s = val_tokens / timing.eval_tokens_per_second
    every = cfg.finetune.eval_every
    points = (cfg.finetune.steps - 1) // every if every else 0
    job = timing.load_seconds + cfg.finetune.steps * timing.step_seconds + (1 + points) * val_s
    parallel = max(1, min(cfg.ray.workers, fine_tunes))
    rounds = math.ceil(fine_tunes / parallel)
    return FinetuneEstimate(seconds=timing.import_seconds + rounds * job + val_s, job_seconds=job, rounds=rounds,
                            parallel=parallel)
