"""Fine-tune jobs beyond one device (finetune.strategy `deepspeed`): one Ray Train TorchTrainer per job, its
workers running engine.protocol.deepspeed.train_worker under DeepSpeed ZeRO.

`train_job_task` is the driver's handle: a task that holds no resources itself, launches the trainer and waits for
it, so the driver keeps its window of jobs in flight exactly as with finetune_job's tasks, and each trainer's
workers queue for their CPUs and GPUs (ScalingConfig) in Ray's scheduler.
"""

from __future__ import annotations

import dataclasses
import tempfile
from typing import Any

import ray

from convalue.actors.progress import report_attempt
from convalue.engine.protocol.deepspeed import TrainJob, ZeroSettings, train_worker
from convalue.engine.protocol.finetune import FinetuneResult

#: the environment of every training worker: no hub access, quiet tokenizers, DeepSpeed on the right accelerator
WORKER_ENV = {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


@ray.remote(num_cpus=0)
class _Mailbox:
    """Where rank 0 leaves the job's result: Ray Train 2.60 (Train V2) keeps a report's metrics only with a
    checkpoint, which would need storage that every node reaches."""

    def __init__(self):
        self.result: dict | None = None

    def put(self, result: dict) -> None:
        self.result = result

    def get(self) -> dict | None:
        return self.result


def _loop(config: dict) -> None:
    """train_loop_per_worker: train; rank 0 posts the result (every worker's is the same)."""
    # Ray Train (the optional `deepspeed` extra; 3.8 s, loads torch): only in a deepspeed fine-tune's workers
    import ray.train
    import ray.train.torch

    device = str(ray.train.torch.get_device()) if config["job"].spec.zero.use_gpu else None
    result = train_worker(config["job"], device)
    if ray.train.get_context().get_world_rank() == 0:
        ray.get(config["mailbox"].put.remote(result))


def scaling_config(zero: ZeroSettings):
    """The workers of one job: zero.workers processes of zero.cpus_per_worker CPUs (and a GPU each with use_gpu)."""
    # Ray Train (the `deepspeed` extra; 3.8 s, loads torch): only when a deepspeed fine-tune is planned
    from ray.train import ScalingConfig

    return ScalingConfig(num_workers=zero.workers, use_gpu=zero.use_gpu,
                         resources_per_worker={"CPU": zero.cpus_per_worker} | ({"GPU": 1} if zero.use_gpu else {}))


def make_trainer(job: TrainJob, mailbox, storage_path: str | None = None, name: str | None = None,
                 max_failures: int = 1):
    """The TorchTrainer of one job: its train loop config is {"job": job, "mailbox": the actor rank 0 posts the
    result to}; the process group is NCCL between GPUs,
    gloo on CPUs; storage_path: where Ray Train keeps the run's state (no checkpoint is written; on a multi-node
    cluster give a path every node reaches); max_failures: worker-group restarts before the job fails (the job is
    restarted from its start: same seed, same result)."""
    # Ray Train (the `deepspeed` extra; 3.8 s, loads torch): only when a deepspeed fine-tune runs
    from ray.train import FailureConfig, RunConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    zero = job.spec.zero
    env = WORKER_ENV | {"DS_ACCELERATOR": "cuda" if zero.use_gpu else "cpu"}
    run = RunConfig(name=name, storage_path=storage_path or tempfile.gettempdir(),
                    failure_config=FailureConfig(max_failures=max_failures),
                    worker_runtime_env={"env_vars": env})
    return TorchTrainer(_loop, train_loop_config={"job": job, "mailbox": mailbox}, scaling_config=scaling_config(zero),
                        torch_config=TorchConfig(backend=zero.backend), run_config=run)


def run_train_metrics(job: TrainJob, storage_path: str | None = None, name: str | None = None) -> dict[str, Any]:
    """Fit one job's trainer; rank 0's result: FinetuneResult's fields, train_losses, world_size, zero_stage."""
    mailbox = _Mailbox.remote()
    try:
        make_trainer(job, mailbox, storage_path, name).fit()  # a failed job raises ray.train's TrainingFailedError
        result = ray.get(mailbox.get.remote())
    finally:
        ray.kill(mailbox)
    if result is None:
        raise RuntimeError(f"fine-tune {job.label!r}: the trainer finished without a result from rank 0")
    return result


def run_train_job(job: TrainJob, progress: object | None = None, storage_path: str | None = None,
                  name: str | None = None) -> FinetuneResult:
    """One fine-tune job across its workers, as finetune_job.run_finetune_job returns it (progress: the run's
    progress actor, told where the job's launcher runs)."""
    report_attempt(progress, "finetune", f"{job.label} (seed {job.spec.finetune.seed})")
    return finetune_result(run_train_metrics(job, storage_path, name))


def run_base_eval_job(job: TrainJob, storage_path: str | None = None) -> float:
    """The fine-tune model's base validation loss alone (when every fine-tune was already stored): `job` with
    base_only (its target and auxiliary examples are not used)."""
    if not job.base_only:
        job = dataclasses.replace(job, base_only=True)
    return float(run_train_metrics(job, storage_path)["base_val_loss"])


def finetune_result(metrics: dict[str, Any]) -> FinetuneResult:
    """The FinetuneResult in a job's result (dropping train_losses, world_size, zero_stage)."""
    return FinetuneResult(**{f.name: metrics[f.name] for f in dataclasses.fields(FinetuneResult)})


# launchers hold no resources (the trainer's workers do) and are not retried (the trainer restarts its workers)
train_job_task = ray.remote(num_cpus=0, max_retries=0)(run_train_job)
base_eval_job_task = ray.remote(num_cpus=0, max_retries=0)(run_base_eval_job)
