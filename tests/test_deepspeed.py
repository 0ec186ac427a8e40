"""finetune.strategy `deepspeed`: the DeepSpeed config and Ray Train trainer of a fine-tune job, and (with the
`deepspeed` extra installed) real ZeRO fine-tunes of the tiny Llama on CPU through Ray Train: two workers under
ZeRO-2 train and follow engine/protocol/finetune.py's single-process trajectory to round-off, and one worker
without ZeRO evaluates the base model exactly as it does."""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import os

import pytest

from convalue.engine.config import FinetuneConfig, LoraConfig
from convalue.engine.data.examples import Example
from convalue.engine.data.tokenize import TokenizedExample
from convalue.engine.protocol.deepspeed import (
    TrainJob,
    TrainJobSpec,
    ZeroSettings,
    batch_draws,
    deepspeed_config,
    eval_batches,
    shard,
    step_plan,
)
from convalue.engine.protocol.finetune import mixing_schedule

pytestmark = [pytest.mark.heavy,  # whole runs: scheduled before the light modules (conftest.py)
              # Ray Train's fit() in this process copies Ray Data's context, whose deprecated fields warn
              pytest.mark.filterwarnings("ignore::DeprecationWarning:ray.data.context")]

HAS_DEEPSPEED = importlib.util.find_spec("deepspeed") is not None
needs_deepspeed = pytest.mark.skipif(not HAS_DEEPSPEED, reason="deepspeed is not installed (pip install "
                                     "'convalue[deepspeed]' -c constraints.txt)")
#: below most steps' gradient norms (0.2 to 1 here): DeepSpeed's clipping is checked against finetune.py's
CLIP = 0.3
LORA = LoraConfig(r=4, alpha=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])


def ex(prompt: str, response: str) -> Example:
    return Example((("user", prompt), ("assistant", response)))


def spec(model_dir: str = "/models/x", **zero) -> TrainJobSpec:
    return TrainJobSpec(model_dir=str(model_dir), dtype="float32", max_length=64,
                        finetune=FinetuneConfig(steps=6, batch_size=4, lr=2e-2, seed=0, max_grad_norm=CLIP),
                        lora=LORA,
                        zero=ZeroSettings(**({"workers": 2, "use_gpu": False} | zero)))


# --- the config and the trainer spec (no deepspeed needed) ---

@pytest.mark.parametrize("stage,opt,par", [(0, "none", "none"), (1, "none", "none"), (1, "cpu", "none"),
                                           (2, "none", "none"), (2, "cpu", "none"), (3, "none", "none"),
                                           (3, "cpu", "cpu")])
def test_deepspeed_config_per_stage(stage, opt, par):
    cfg = FinetuneConfig(batch_size=5, max_grad_norm=0.5, lr=3e-4)
    ds = deepspeed_config(ZeroSettings(workers=2, use_gpu=True, stage=stage, offload_optimizer=opt,
                                       offload_param=par), cfg)
    z = ds["zero_optimization"]
    assert z["stage"] == stage
    assert ds["gradient_clipping"] == 0.5 and ds["gradient_accumulation_steps"] == 1
    assert ds["train_micro_batch_size_per_gpu"] == 3  # ceil(5 / 2): informational, the loss is scaled by hand
    assert "fp16" not in ds and "bf16" not in ds  # fp32 optimizer states; bf16 autocast as in finetune.py
    assert ("offload_optimizer" in z) == (opt == "cpu") and ("offload_param" in z) == (par == "cpu")
    if opt == "cpu":  # DeepSpeed's CPU AdamW, with torch.optim.AdamW's defaults and the run's lr
        assert ds["optimizer"] == {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.9, 0.999], "eps": 1e-8,
                                                               "weight_decay": 0.01}}
        assert z["offload_optimizer"] == {"device": "cpu", "pin_memory": True}
    else:
        assert "optimizer" not in ds  # the job passes torch.optim.AdamW itself
    assert ("stage3_gather_16bit_weights_on_model_save" in z) == (stage == 3)


@pytest.mark.parametrize("bad", [{"stage": 4}, {"stage": True}, {"workers": 0}, {"offload_optimizer": "nvme"},
                                 {"stage": 0, "offload_optimizer": "cpu"}, {"stage": 2, "offload_param": "cpu"}])
def test_zero_settings_refuse_what_deepspeed_cannot_do(bad):
    with pytest.raises(ValueError):
        ZeroSettings(**bad)


def test_zero_settings_from_a_config_section_and_backend():
    section = type("Section", (), {"workers": 4, "use_gpu": True, "cpus_per_worker": 2, "stage": 3,
                                   "offload_optimizer": "cpu", "offload_param": "none", "other": 1})()
    z = ZeroSettings.from_config(section)
    assert (z.workers, z.stage, z.offload_optimizer, z.backend) == (4, 3, "cpu", "nccl")
    assert ZeroSettings(use_gpu=False).backend == "gloo"


def test_the_job_message_carries_raw_examples_and_checks_them():
    s = spec()
    job = TrainJob(s.for_job(3, 0.25), "kmm@1", (ex("a", "b"),), {"g": (ex("c", "d"),)}, (ex("e", "f"),),
                   weights={"g": 1.0})
    assert job.spec.finetune.seed == 3 and job.spec.finetune.rho == 0.25 and s.finetune.seed == 0
    assert dataclasses.is_dataclass(job) and job.target[0].messages[1] == ("assistant", "b")
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.label = "x"  # type: ignore[misc]
    with pytest.raises(ValueError, match="mixture weights"):
        TrainJob(s, "x", (ex("a", "b"),), {"g": (ex("c", "d"),)}, (ex("e", "f"),), weights={"h": 1.0})
    with pytest.raises(ValueError, match="target training"):
        TrainJob(s, "x", (), {}, (ex("e", "f"),))


def test_draws_and_batches_are_finetune_pys():
    cfg = FinetuneConfig(steps=40, rho=0.3, seed=7, batch_size=3)
    plan = step_plan(cfg, ["a", "b"], {"a": 0.25, "b": 0.75})
    assert plan == mixing_schedule(40, 0.3, 2, 7, [0.25, 0.75])
    sizes = {-1: 5, 0: 2, 1: 9}
    draws = list(batch_draws(plan, sizes, 3, 7))
    assert [len(d) for d in draws] == [min(3, sizes[s]) for s in plan]
    assert all(len(set(d.tolist())) == len(d) and max(d) < sizes[s] for d, s in zip(draws, plan))
    assert (shard(range(5), 0, 2), shard(range(5), 1, 2), shard(range(1), 1, 2)) == ([0, 2, 4], [1, 3], [])
    toks = [TokenizedExample(tuple(range(n)), tuple(range(n))) for n in (5, 2, 9, 2, 7)]
    assert [[len(t) for t in b] for b in eval_batches(toks, 2)] == [[2, 2], [5, 7], [9]]


def test_trainer_spec():
    pytest.importorskip("ray.train", reason="ray.train needs ray[train] (pandas, pyarrow, fsspec, pydantic)")
    from convalue.actors.train_job import make_trainer, scaling_config

    job = TrainJob(spec(stage=2, workers=3, cpus_per_worker=2), "t", (ex("a", "b"),), {}, (ex("e", "f"),))
    sc = scaling_config(job.spec.zero)
    assert (sc.num_workers, sc.use_gpu, sc.resources_per_worker) == (3, False, {"CPU": 2})
    gpu = scaling_config(ZeroSettings(workers=8, use_gpu=True, stage=3))
    assert (gpu.num_workers, gpu.use_gpu, gpu.resources_per_worker) == (8, True, {"CPU": 1, "GPU": 1})
    trainer = make_trainer(job, mailbox=None, storage_path="/tmp/x", name="n")
    assert trainer.train_loop_config["job"] is job
    assert trainer.backend_config.backend == "gloo"
    assert trainer.scaling_config.num_workers == 3
    assert trainer.run_config.worker_runtime_env["env_vars"]["DS_ACCELERATOR"] == "cpu"
    assert trainer.run_config.failure_config.max_failures == 1


# --- real ZeRO fine-tunes on CPU (gloo) through Ray Train ---

REPEATED = (ex("What is two plus two?", "Four."), ex("Name a colour.", "Blue."),
            ex("Say hello.", "Hello!"), ex("What is the capital of France?", "Paris."))
TARGET = tuple(ex(f"What is {i} plus {i}?", f"It is {2 * i}.") for i in range(8))
AUX = {"hello": tuple(ex(f"Greet person {i}.", "Hello there!") for i in range(6)),
       "count": tuple(ex(f"Count to {i}.", " ".join(map(str, range(i + 1)))) for i in range(1, 6))}
ONE = {"one": (ex("Say yes.", "Yes."),)}  # a group smaller than the workers: one of them sits its steps out
VAL = tuple(ex(f"What is {i} plus {i}?", f"It is {2 * i}.") for i in range(8, 13))


def reference(job: TrainJob) -> tuple[dict, list[float]]:
    """engine/protocol/finetune.py's single-process fine-tune of the job (same tokens): (result, step losses)."""
    import torch

    import convalue.engine.protocol.finetune as ft
    from convalue.engine.model.loading import load_model, load_tokenizer
    from convalue.engine.protocol.deepspeed import tokenize_job

    tok = load_tokenizer(job.spec.model_dir)
    target, aux, val = tokenize_job(tok, job)
    torch.manual_seed(job.spec.finetune.seed)
    model = load_model(job.spec.model_dir, job.spec.dtype)
    base = ft.evaluate_loss(model, val, job.spec.finetune.eval_batch_size, tok.pad_token_id)
    steps: list[float] = []
    loss_fn = ft.per_example_loss

    def spy(*args):  # the loss of each training step, as finetune() logs it
        out = loss_fn(*args)
        if torch.is_grad_enabled():
            steps.append(out.mean().item())
        return out

    mp = pytest.MonkeyPatch()
    mp.setattr(ft, "per_example_loss", spy)
    try:
        r = ft.finetune(model, tok.pad_token_id, job.spec.finetune, job.spec.lora, label=job.label, target=target,
                        aux=aux, val=val, base_val_loss=base, weights=job.weights)
    finally:
        mp.undo()
    return r.to_dict(), steps


#: the merged job's auxiliary groups, mixed by weight: "one" is smaller than the workers, "count" is drawn from
MIXED = {"count": AUX["count"]} | ONE
WEIGHTS = {"count": 0.3, "one": 0.7}
#: 8 steps: 5 on the target, 3 on the groups (the plan: test_two_worker_zero2_trains_on_cpu)
ZERO2_RUN = FinetuneConfig(steps=8, batch_size=4, lr=2e-2, rho=0.5, seed=5, max_grad_norm=CLIP)


@pytest.fixture(scope="module")
def zero_runs(ray_session, tiny_model_dir, tmp_path_factory):
    """Two Ray Train jobs at once (each starts a controller, helper actors and its workers, which import torch,
    transformers, peft and deepspeed: the jobs are what this module costs), with finetune.py's single-process
    fine-tune of the first: a two-worker ZeRO-2 fine-tune, launched from this process, whose target steps see one
    repeated batch and whose auxiliary steps mix two groups by weight, one smaller than the workers; and the
    driver's base-only evaluation (its launcher task) on one worker without ZeRO. A second run of the same seed
    would only repeat the 1e-6 match; stage 0's training and the other stages: the opt-in test at the end."""
    if not HAS_DEEPSPEED:
        pytest.skip("deepspeed is not installed (pip install 'convalue[deepspeed]' -c constraints.txt)")
    from convalue.actors.train_job import base_eval_job_task, run_train_metrics

    store = str(tmp_path_factory.mktemp("ray-train"))
    job = TrainJob(dataclasses.replace(spec(tiny_model_dir, stage=2), finetune=ZERO2_RUN), "zero2", REPEATED,
                   MIXED, VAL, weights=WEIGHTS, with_base=True)
    # the driver's job when every fine-tune is stored: aux and with_base dropped, base_only set by the launcher
    one = dataclasses.replace(job, spec=spec(tiny_model_dir, stage=0, workers=1), aux={}, weights=None,
                              with_base=False)
    base = base_eval_job_task.remote(one, store)
    got = run_train_metrics(job, store)
    return {"job": job, "zero2": got, "base": ray_session.get(base), "ref": reference(job)}


@needs_deepspeed
def test_two_worker_zero2_trains_on_cpu(zero_runs):
    a, cfg = zero_runs["zero2"], zero_runs["job"].spec.finetune
    plan = step_plan(cfg, sorted(MIXED), WEIGHTS)
    # the weights decide the draws: uniform draws, or the weights the other way round, would draw other steps
    assert plan != step_plan(cfg, sorted(MIXED), None)
    assert plan != step_plan(cfg, sorted(MIXED), {"count": WEIGHTS["one"], "one": WEIGHTS["count"]})
    # both groups drawn; no target step right after the first, whose lr is 0 (warm-up): its loss would not fall
    assert sorted(set(plan)) == [-1, 0, 1] and plan[:2] == [-1, 1]
    assert a["world_size"] == 2 and a["zero_stage"] == 2 and a["steps"] == 8 == len(a["train_losses"])
    assert a["target_steps"] == 5 and a["aux_steps"] == 3 and a["groups"] == ["count", "one"]
    repeated = [loss for loss, src in zip(a["train_losses"], plan) if src < 0]
    # the target steps see one batch again and again: its loss falls each time
    assert all(later < earlier for earlier, later in zip(repeated, repeated[1:])), repeated
    assert repeated[-1] < repeated[0] - 0.05
    assert math.isfinite(a["val_loss"]) and a["val_loss"] < a["base_val_loss"]


@needs_deepspeed
def test_two_worker_zero2_follows_the_single_process_fine_tune(zero_runs):
    """Data parallelism changes only the order of sums: each worker's loss is its share of the batch's sum scaled
    by world/batch, so the averaged gradient is the batch mean's; a worker with no example of a step (the group
    "one") adds nothing to it; the groups are drawn by the same weights."""
    ref, steps = zero_runs["ref"]
    a = zero_runs["zero2"]
    assert (a["target_steps"], a["aux_steps"], a["groups"]) == (ref["target_steps"], ref["aux_steps"],
                                                                ref["groups"])
    assert a["train_losses"] == pytest.approx(steps, rel=1e-6)
    assert a["val_loss"] == pytest.approx(ref["val_loss"], rel=1e-6)
    assert a["base_val_loss"] == pytest.approx(ref["base_val_loss"], rel=1e-6)


@needs_deepspeed
def test_a_base_only_job_on_one_worker_equals_the_single_process_evaluation(zero_runs):
    """The driver's base evaluation (once every fine-tune is stored): one worker evaluates the same batches as
    evaluate_loss and sums them in the same order."""
    assert zero_runs["base"] == zero_runs["ref"][0]["base_val_loss"]


STAGES = [(0, "none", "none", "float32"), (1, "none", "none", "float32"), (3, "none", "none", "float32"), (2, "cpu", "none", "float32"),
          (3, "cpu", "cpu", "float32"), (3, "none", "none", "bfloat16")]


@needs_deepspeed
@pytest.mark.skipif(not os.environ.get("CONVALUE_DEEPSPEED_STAGES"),
                    reason="every ZeRO stage and the offloads, two workers each: set CONVALUE_DEEPSPEED_STAGES=1 "
                           "(about 30 s each on 2 cores; the first offload run compiles DeepSpeed's cpu_adam)")
@pytest.mark.parametrize("stage,opt,par,dtype", STAGES)
def test_every_zero_stage_follows_the_single_process_fine_tune(ray_session, tiny_model_dir, tmp_path, stage, opt,
                                                               par, dtype):
    """Two workers at every stage, with the offloads, and ZeRO-3 building bf16 weights partitioned."""
    from convalue.actors.train_job import run_train_metrics

    s = dataclasses.replace(spec(tiny_model_dir, stage=stage, offload_optimizer=opt, offload_param=par),
                            dtype=dtype)
    job = TrainJob(s, "mixed", TARGET, AUX, VAL, weights={"hello": 0.3, "count": 0.7}, with_base=True)
    got = ray_session.get(ray_session.remote(num_cpus=0)(run_train_metrics).remote(job, str(tmp_path)))
    ref, steps = reference(job)
    assert got["world_size"] == 2 and got["zero_stage"] == stage and got["partitioned_at_load"] == (stage == 3)
    tol = 1e-4 if dtype == "bfloat16" else 1e-6
    assert got["train_losses"] == pytest.approx(steps, rel=tol)
    assert got["val_loss"] == pytest.approx(ref["val_loss"], rel=tol)
    assert got["base_val_loss"] == pytest.approx(ref["base_val_loss"], rel=1e-6)
