"""The evaluation protocol's dispatch (paper Alg. 1): every cell fine-tuned under each seed — a Ray task on one
device, or a Ray Train job under DeepSpeed ZeRO — each distinct selection once per seed and only where the run
folder does not hold it already. Run on a solver actor; the driver starts it and awaits the outcome."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import ray

from convalue.actors.finetune_job import base_eval_task, finetune_task
from convalue.actors.pool import windowed
from convalue.engine.config import RunConfig
from convalue.engine.data.prepare import PreparedData, target_splits
from convalue.engine.data.tokenize import tokenize_examples
from convalue.engine.files.folder import RunFolder
from convalue.engine.model.spec import ReplicaSpec
from convalue.engine.protocol.evaluate import (
    PlannedRun,
    distinct_jobs,
    mix_runs,
    plan_runs,
    summarise,
)
from convalue.engine.store.finetunes import FinetuneStore, job_settings, train_job_settings

log = logging.getLogger("convalue")


@dataclass(frozen=True)
class FinetuneTask:
    """One fine-tune to run: job j of the distinct jobs under one seed (-1: the base model's loss alone)."""

    index: int
    label: str
    seed: int | None

    def __repr__(self) -> str:
        return "base-model evaluation" if self.index < 0 else f"fine-tune {self.label!r} (seed {self.seed})"


@dataclass(frozen=True)
class Runners:
    """The Ray remote functions that run a fine-tune and the base model's evaluation (tests pass failing ones)."""

    finetune: Any = None
    base_eval: Any = None

    def task(self) -> Any:
        """The fine-tune task (actors.finetune_job's by default)."""
        return self.finetune or finetune_task

    def base(self) -> Any:
        """The base-model evaluation task."""
        return self.base_eval or base_eval_task


@dataclass(frozen=True, eq=False)
class EvaluationRequest:
    """What the dispatch needs: the run's config, the replica (and, for DeepSpeed, the training job) specs, the
    tokenizer, the prepared data, each method's scores by seed, beta, the given mixture weights, the run folder."""

    cfg: RunConfig
    spec: ReplicaSpec
    tokenizer: Any
    data: PreparedData
    names: list[str]
    scores: dict[int, dict[str, np.ndarray]]
    beta: np.ndarray
    given: dict[str, float] | None
    run_dir: RunFolder
    train_spec: Any = None  # engine.protocol.deepspeed.TrainJobSpec with finetune.strategy `deepspeed`
    runners: Runners = Runners()
    bought: dict[str, dict[int, list[int]]] | None = None  # methods that buy given candidates at each k (a path)

    def usable(self, name: str) -> list:
        """A candidate group's tokenised examples with response tokens (tokenised once per request)."""
        cache = self.__dict__.setdefault("_tokens", {})
        if name not in cache:
            group = next(g for g in self.data.candidates if g.name == name)
            toks = tokenize_examples(self.tokenizer, group.examples, self.cfg.model.max_length)
            cache[name] = [t for t in toks if t.n_response > 0]
        return cache[name]


@dataclass
class FinetuneOutcome:
    """The protocol's rows (one per cell and seed) and its evaluation; while it runs, the fine-tunes finished so
    far, which a failed summary lists (`finished`)."""

    rows: list[dict] = field(default_factory=list)
    evaluation: dict | None = None
    finished: list[dict] = field(default_factory=list)


def effective_rho(run: PlannedRun, cfg: RunConfig) -> float:
    """The share of target steps a run was drawn with: its rho_k, finetune.rho, or 1 with no group bought."""
    return 1.0 if not run.groups else run.rho if run.rho is not None else cfg.finetune.rho


@dataclass
class Trained:
    """The fine-tunes of a list of (job, seed) tasks: each one's record, which were trained now (not read back),
    and the base model's validation loss."""

    results: list[dict]
    trained: set[int]
    base: float | None
    base_accuracy: float | None = None


def train_jobs(req: EvaluationRequest, jobs: list[PlannedRun], tasks: list[tuple[int, int]], progress: Any,
               outcome: FinetuneOutcome, stage: str = "finetune") -> Trained:
    """Fine-tune every (job, seed) of `tasks` that the run folder does not hold yet (each a Ray task, or a Ray
    Train job with DeepSpeed), storing each record as it finishes; `outcome.finished` lists what is done even when
    one fails."""
    cfg, spec, data = req.cfg, req.spec, req.data
    usable = req.usable
    settings = job_settings(spec) if req.train_spec is None else train_job_settings(req.train_spec, spec)
    store = FinetuneStore(req.run_dir.sub("finetunes"), settings, data.target_train, data.target_val)
    auxes = [{n: usable(n) for n in job.groups} for job in jobs]
    keys = [store.job_key(auxes[j], seed, jobs[j].weight_map(), jobs[j].rho) for j, seed in tasks]
    results: list[dict | None] = [store.get(k) for k in keys]
    base = store.get_base()
    todo = [i for i, r in enumerate(results) if r is None]
    trained = set(todo)
    progress.total.remote(stage, len(tasks))
    progress.advance.remote(stage, len(tasks) - len(todo))
    log.info("%d fine-tunes (%s), %d stored in %s", len(tasks), stage, len(tasks) - len(todo), store.root)
    first = todo[0] if todo else None
    base_accuracy = None
    if req.train_spec is None:
        opts = {"num_cpus": cfg.ray.cpus_per_worker, "num_gpus": cfg.ray.gpus_per_worker}
        train, val = ray.put(data.target_train), ray.put(data.target_val)
        val_raw = ray.put(target_splits(data.target, cfg.data)[1]
                          if "accuracy" in cfg.finetune.metrics else None)

        def submit(_: object, task: FinetuneTask):
            if task.index < 0:
                return req.runners.base().options(**opts).remote(spec, val)
            j, seed = tasks[task.index]
            return req.runners.task().options(**opts).remote(
                spec.for_job(seed, jobs[j].rho), jobs[j].label, train, auxes[j], val,
                base is None and task.index == first, jobs[j].weight_map(), progress, val_raw)
        window = max(1, cfg.ray.workers * cfg.ray.max_in_flight)
    else:
        submit = _deepspeed_submit(req, jobs, tasks, base, first, progress)
        window = max(1, cfg.ray.max_in_flight)

    payloads = [FinetuneTask(i, jobs[tasks[i][0]].label, tasks[i][1]) for i in todo]
    if base is None and not todo:
        payloads.append(FinetuneTask(-1, "base", None))
    try:
        for done, (task, result) in enumerate(windowed([None], payloads, submit, window), start=1):
            if task.index < 0:
                base = result
                store.put_base(base)
                continue
            i = task.index
            results[i] = result.to_dict()
            store.put(keys[i], results[i])
            progress.advance.remote(stage)
            if results[i]["base_val_loss"] is not None:
                base = results[i]["base_val_loss"]
                store.put_base(base)
                base_accuracy = results[i].get("base_val_accuracy")
            log.info("fine-tune %d/%d done: %s (seed %d), validation loss %.4f", done, len(todo), task.label,
                     task.seed, results[i]["val_loss"])
    finally:  # on a failure (or Ctrl-C) the fine-tunes are incomplete: say what there is
        outcome.finished = [{"label": jobs[j].label, "groups": list(jobs[j].groups), "weights": jobs[j].weight_map(),
                             "rho": effective_rho(jobs[j], cfg), "seed": seed, "val_loss": results[i]["val_loss"],
                             "reused": i not in trained}
                            for i, (j, seed) in enumerate(tasks) if results[i] is not None]
    if base_accuracy is None:  # read back from a stored record that measured it
        base_accuracy = next((r.get("base_val_accuracy") for r in results if r and r.get("base_val_accuracy")
                              is not None), None)
    return Trained(results=results, trained=trained, base=base, base_accuracy=base_accuracy)


def run_protocol(req: EvaluationRequest, progress: Any, outcome: FinetuneOutcome) -> FinetuneOutcome:
    """Fine-tune every cell under each of its seeds (req.scores: each method's scores by seed, the random order may
    differ; req.given: every candidate's weight under `mixture: given`). `outcome` is filled as fine-tunes finish,
    so a caller that catches a failure still has what was done. progress: the run's progress actor handle."""
    cfg, names, scores, beta = req.cfg, req.names, req.scores, req.beta
    ks, seeds = cfg.evaluation_ks(), cfg.finetune.seeds()
    plans = {s: plan_runs(names, scores[s], beta, ks, "target_only" in cfg.finetune.baselines, cfg.finetune.rho_at,
                          req.bought)
             for s in seeds}  # one per seed, alike but for a random order per seed
    sizes = {n: len(req.usable(n)) for plan in plans.values() for r in plan for n in r.groups}
    plans = {s: mix_runs(plan, cfg.finetune.mixture, scores[s], names, sizes, cfg.finetune.mixture_temperature,
                         req.given) for s, plan in plans.items()}
    cells = [(s, i) for s in seeds for i in range(len(plans[s]))]
    jobs, served_by = distinct_jobs([plans[s][i] for s, i in cells])
    job_of = dict(zip(cells, served_by))
    tasks = list(dict.fromkeys((job_of[c], c[0]) for c in cells))  # seed-major: every cell has a loss early
    log.info("%d protocol runs (%d methods x k in %s) x %d seed(s)", len(plans[seeds[0]]), len(scores[seeds[0]]),
             ks, len(seeds))
    done = train_jobs(req, jobs, tasks, progress, outcome)
    index = {task: i for i, task in enumerate(tasks)}
    rows = []
    for i in range(len(plans[seeds[0]])):  # cell by cell, each with its seeds
        for s in seeds:
            run, t = plans[s][i], index[job_of[s, i], s]
            rows.append(done.results[t] | {"label": run.label, "method": run.method, "k": run.k, "seed": s,
                                           "weights": run.weight_map(), "rho": effective_rho(run, cfg),
                                           "base_val_loss": done.base, "base_val_accuracy": done.base_accuracy,
                                           "reused": t not in done.trained})
    outcome.rows = rows
    trained_now = len(done.trained)
    outcome.evaluation = summarise(rows, ks, cfg.finetune.select_by) | {
        "fine_tunes": {"trained": trained_now, "reused": len(tasks) - trained_now}}
    if "accuracy" in cfg.finetune.metrics:  # best k and Borda on the other metric too
        other = "loss" if cfg.finetune.select_by == "accuracy" else "accuracy"
        outcome.evaluation[f"by_{other}"] = {k: v for k, v in summarise([dict(r) for r in rows], ks, other).items()
                                             if k in ("best_k", "borda", "kmm_minus", "target_only_val_accuracy",
                                                      "base_val_accuracy")}
    return outcome


def run_subsets(req: EvaluationRequest, subsets: list[tuple[str, ...]], progress: Any, outcome: FinetuneOutcome,
                stage: str = "subsets") -> tuple[dict[tuple[str, ...], float], float, float | None]:
    """The validation loss of target + S for every subset S (once per finetune.seed; the empty subset is the
    target alone), for fitted baselines and the faithfulness study: ({S: loss}, the target-only loss, base loss)."""
    seed = req.cfg.finetune.seed
    jobs = [PlannedRun("subset", None, tuple(sorted(s)), rho=None) for s in dict.fromkeys([(), *subsets])]
    done = train_jobs(req, jobs, [(j, seed) for j in range(len(jobs))], progress, outcome, stage)
    losses = {job.groups: r["val_loss"] for job, r in zip(jobs, done.results)}
    return {tuple(sorted(s)): losses[tuple(sorted(s))] for s in subsets}, losses[()], done.base


def _deepspeed_submit(req: EvaluationRequest, jobs: list[PlannedRun], tasks: list[tuple[int, int]],
                      base: float | None, first: int | None, progress: Any):
    """submit() for finetune.strategy `deepspeed`: each job a Ray Train run of raw examples (the fine-tune model
    tokenises them itself)."""
    from convalue.actors.train_job import base_eval_job_task, train_job_task
    from convalue.engine.protocol.deepspeed import TrainJob

    cfg, data = req.cfg, req.data
    raw_train, raw_val = target_splits(data.target, cfg.data)
    raw = {g.name: list(g.examples) for g in data.candidates}

    def submit(_: object, task: FinetuneTask):
        if task.index < 0:
            return base_eval_job_task.remote(TrainJob(req.train_spec, "base", raw_train, {}, raw_val, base_only=True))
        j, seed = tasks[task.index]
        job = TrainJob(req.train_spec.for_job(seed, jobs[j].rho), jobs[j].label, raw_train,
                       {n: raw[n] for n in jobs[j].groups}, raw_val, jobs[j].weight_map(),
                       with_base=base is None and task.index == first)
        return train_job_task.remote(job, progress)
    return submit
