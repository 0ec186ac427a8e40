"""The evaluation protocol's dispatch (paper Alg. 1): every cell fine-tuned under each seed — a Ray task on one
device, or a Ray Train job under DeepSpeed ZeRO — each distinct selection once per seed and only where the run
folder does not hold it already. Run on a solver actor; the driver starts it and awaits the outcome."""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import ray

from convalue.actors.finetune_job import base_eval_task, finetune_task
from convalue.actors.pool import windowed
from convalue.actors.train_job import base_eval_job_task, train_job_task
from convalue.engine.config import RunConfig
from convalue.engine.config.sources import TARGET_VAL
from convalue.engine.data.prepare import PreparedData, evaluation_sets, target_splits
from convalue.engine.data.tokenize import tokenize_examples
from convalue.engine.files.folder import RunFolder
from convalue.engine.model.spec import ReplicaSpec
from convalue.engine.protocol.curves import cell_curves
from convalue.engine.protocol.deepspeed import TrainJob
from convalue.engine.protocol.evaluate import (
    PlannedRun,
    distinct_jobs,
    mix_runs,
    plan_runs,
)
from convalue.engine.protocol.measures import Measure
from convalue.engine.protocol.summaries import TARGET_LOSS, summarise, summarise_measure
from convalue.engine.protocol.tuning import RhoTuning, choose_rho
from convalue.engine.protocol.verdict import verdict_of
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
    far and rho_k once tuned, which a failed summary keeps (`finished`, `tuning`: evaluation.tuning's record)."""

    rows: list[dict] = field(default_factory=list)
    evaluation: dict | None = None
    finished: list[dict] = field(default_factory=list)
    tuning: dict | None = None


def effective_rho(run: PlannedRun, cfg: RunConfig) -> float:
    """The share of target steps a run was drawn with: its rho_k, finetune.rho, or 1 with no group bought."""
    return 1.0 if not run.groups else run.rho if run.rho is not None else cfg.finetune.rho


@dataclass
class Trained:
    """The fine-tunes of a list of (job, seed) tasks: each one's record, which were trained now (not read back),
    and the base model's values on every evaluation (`base_evaluations`, by name)."""

    results: list[dict]
    trained: set[int]
    base_evaluations: dict[str, dict] | None

    def base(self, measure: Measure = TARGET_LOSS) -> float | None:
        """The base model's value on `measure` (default: the target's validation loss)."""
        return ((self.base_evaluations or {}).get(measure.evaluation) or {}).get(measure.metric)


def without_curve(req: EvaluationRequest) -> EvaluationRequest:
    """The request with finetune.eval_every 0: fine-tunes nobody draws a curve of (rho_k's tuning, the fitted
    baselines' and analyses' subsets) train and are keyed without one, so runs with and without curves share them."""
    if not req.spec.finetune.eval_every:
        return req
    return dataclasses.replace(req, spec=dataclasses.replace(
        req.spec, finetune=dataclasses.replace(req.spec.finetune, eval_every=0)))


def finetune_store(req: EvaluationRequest) -> FinetuneStore:
    """The run folder's fine-tune records as the protocol keys them: by the job's settings and data and, where
    data.eval names evaluations, by their names and examples too (a record measured on other sets is another
    fine-tune's); finetune.select_by only chooses among the measures, so only its metric is in the key (the
    metric alone was select_by's whole value before evaluations had names)."""
    spec = req.spec
    metric = spec.finetune.select_by_parts()[1]
    spec = dataclasses.replace(spec, finetune=dataclasses.replace(spec.finetune, select_by=metric))
    settings = job_settings(spec) if req.train_spec is None else train_job_settings(req.train_spec, spec)
    val = list(req.data.target_val)
    if req.data.evals:
        settings = settings | {"evaluations": [[e.name, len(e.tokens)] for e in req.data.evals]}
        val += [t for e in req.data.evals for t in e.tokens]  # the evaluations' examples key it beside the split
    return FinetuneStore(req.run_dir.sub("finetunes"), settings, req.data.target_train, val)


def _measured(record: dict | None, names: list[str], key: str = "evaluations") -> dict | None:
    """A stored record that measured every evaluation of `names` (else None: it is measured again)."""
    if record is None or not names:
        return record
    held = record.get(key)
    return record if isinstance(held, dict) and all(isinstance(held.get(n), dict) for n in names) else None


def _stored_base(store: FinetuneStore, names: list[str]) -> dict[str, dict] | None:
    """The base model's stored values on every evaluation (a record from before data.eval holds the validation
    split's loss alone: enough where there is no other evaluation)."""
    record = store.get(store.base_key(), {"base_val_loss": float})
    if record is None:
        return None
    held = record.get("base_evaluations")
    if isinstance(held, dict) and all(isinstance(held.get(n), dict) for n in [TARGET_VAL, *names]):
        return held
    return None if names else {TARGET_VAL: {"loss": record["base_val_loss"], "accuracy": None}}


def _put_base(store: FinetuneStore, values: dict[str, dict], names: list[str]) -> None:
    """Store the base model's validation loss and, where data.eval names evaluations (`names`), its values on
    every evaluation (without them the record is the one runs have always kept)."""
    store.put(store.base_key(), {"base_val_loss": values[TARGET_VAL]["loss"]}
              | ({"base_evaluations": values} if names else {}))


def _as_plain(values: Any) -> dict[str, dict] | None:
    """{name: EvalScore} (a job's or the base task's) or a record's {name: {loss, accuracy}} as plain data."""
    if values is None:
        return None
    return {n: dataclasses.asdict(v) if dataclasses.is_dataclass(v) else dict(v) for n, v in values.items()}


def train_jobs(req: EvaluationRequest, jobs: list[PlannedRun], tasks: list[tuple[int, int]], progress: Any,
               outcome: FinetuneOutcome, stage: str = "finetune") -> Trained:
    """Fine-tune every (job, seed) of `tasks` that the run folder does not hold yet (each a Ray task, or a Ray
    Train job with DeepSpeed), storing each record as it finishes; `outcome.finished` lists what is done even when
    one fails."""
    cfg, spec, data = req.cfg, req.spec, req.data
    usable = req.usable
    names = [e.name for e in data.evals]
    store = finetune_store(req)
    auxes = [{n: usable(n) for n in job.groups} for job in jobs]
    keys = [store.job_key(auxes[j], seed, jobs[j].weight_map(), jobs[j].rho) for j, seed in tasks]
    results: list[dict | None] = [_measured(store.get(k), names) for k in keys]
    base = _stored_base(store, names)
    todo = [i for i, r in enumerate(results) if r is None]
    trained = set(todo)
    progress.total.remote(stage, len(tasks))
    progress.advance.remote(stage, len(tasks) - len(todo))
    log.info("%d fine-tunes (%s), %d stored in %s", len(tasks), stage, len(tasks) - len(todo), store.root)
    first = todo[0] if todo else None
    if req.train_spec is None:
        opts = {"num_cpus": cfg.ray.cpus_per_worker, "num_gpus": cfg.ray.gpus_per_worker}
        train, val, evals = ray.put(data.target_train), ray.put(data.target_val), ray.put(data.evals)
        val_raw = ray.put(target_splits(data.target, cfg.data)[1]
                          if "accuracy" in cfg.finetune.metrics else None)

        def submit(_: object, task: FinetuneTask):
            if task.index < 0:
                return req.runners.base().options(**opts).remote(spec, val, val_raw, evals)
            j, seed = tasks[task.index]
            return req.runners.task().options(**opts).remote(
                spec.for_job(seed, jobs[j].rho), jobs[j].label, train, auxes[j], val,
                base is None and task.index == first, jobs[j].weight_map(), progress, val_raw, evals)
        window = max(1, cfg.ray.workers * cfg.ray.max_in_flight)
    else:
        submit = _deepspeed_submit(req, jobs, tasks, None if base is None else base[TARGET_VAL]["loss"], first,
                                   progress)
        window = max(1, cfg.ray.max_in_flight)

    def finished_here() -> list[dict]:
        """This stage's fine-tunes done so far (stored ones included)."""
        return [{"label": jobs[j].label, "groups": list(jobs[j].groups), "weights": jobs[j].weight_map(),
                 "rho": effective_rho(jobs[j], cfg), "seed": seed, "val_loss": results[i]["val_loss"],
                 "reused": i not in trained} for i, (j, seed) in enumerate(tasks) if results[i] is not None]

    before = list(outcome.finished)  # an earlier stage's (rho_k's tuning, a fitted baseline's)

    def finished_now() -> list[dict]:
        """The fine-tunes done so far, this stage's after the earlier stages', as a stopped run's summary lists
        them."""
        return before + finished_here()

    outcome.finished = finished_now()  # kept current: a stopped run asks for it while this still awaits its jobs
    payloads = [FinetuneTask(i, jobs[tasks[i][0]].label, tasks[i][1]) for i in todo]
    if base is None and not todo:
        payloads.append(FinetuneTask(-1, "base", None))
    try:
        for done, (task, result) in enumerate(windowed([None], payloads, submit, window), start=1):
            if task.index < 0:
                base = _as_plain(result) if isinstance(result, dict) else {TARGET_VAL: {"loss": result,
                                                                                         "accuracy": None}}
                _put_base(store, base, names)
                continue
            i = task.index
            results[i] = result.to_dict()
            store.put(keys[i], results[i])
            outcome.finished = finished_now()
            progress.advance.remote(stage)
            if results[i]["base_val_loss"] is not None:
                base = _as_plain(results[i].get("base_evaluations")) or {TARGET_VAL: {
                    "loss": results[i]["base_val_loss"], "accuracy": results[i].get("base_val_accuracy")}}
                _put_base(store, base, names)
            log.info("fine-tune %d/%d done: %s (seed %d), validation loss %.4f", done, len(todo), task.label,
                     task.seed, results[i]["val_loss"])
    finally:  # on a failure the fine-tunes are incomplete: say what there is
        outcome.finished = finished_now()
    if base is not None and base[TARGET_VAL].get("accuracy") is None:  # read back from a record that measured it
        accuracy = next((r.get("base_val_accuracy") for r in results if r and r.get("base_val_accuracy")
                         is not None), None)
        base = base | {TARGET_VAL: base[TARGET_VAL] | {"accuracy": accuracy}}
    return Trained(results=results, trained=trained, base_evaluations=base)


def planned(req: EvaluationRequest, seeds: list[int], rho_at: Any) -> dict[int, list[PlannedRun]]:
    """Each seed's protocol cells (alike but for a random order per seed) with their mixture weights, each drawn
    with rho_at(k)."""
    cfg, names, scores = req.cfg, req.names, req.scores
    plans = {s: plan_runs(names, scores[s], req.beta, cfg.evaluation_ks(), "target_only" in cfg.finetune.baselines,
                          rho_at, req.bought) for s in seeds}
    sizes = {n: len(req.usable(n)) for plan in plans.values() for r in plan for n in r.groups}
    return {s: mix_runs(plan, cfg.finetune.mixture, scores[s], names, sizes, cfg.finetune.mixture_temperature,
                        req.given) for s, plan in plans.items()}


def tune_rho(req: EvaluationRequest, progress: Any, outcome: FinetuneOutcome) -> RhoTuning:
    """finetune.tune: every method's cells at every k under each grid ratio and tuning seed (seeds of their own,
    after the reported ones; stored fine-tunes read back), and rho_k chosen on tune.by (engine.protocol.tuning)."""
    req, ft = without_curve(req), req.cfg.finetune
    seeds = ft.tuning_seeds()
    cells = [(rho, s, run) for rho in ft.tune.rho
             for s, plan in planned(req, seeds, lambda k, rho=rho: rho).items() for run in plan if run.groups]
    jobs, served_by = distinct_jobs([run for _, _, run in cells])
    tasks = list(dict.fromkeys((j, s) for j, (_, s, _) in zip(served_by, cells)))
    log.info("tuning rho_k over %s on %s: %d fine-tunes", ft.tune.rho, ft.tune.by, len(tasks))
    start = time.perf_counter()
    done = train_jobs(req, jobs, tasks, progress, outcome, stage="tune")
    progress.end.remote("tune", time.perf_counter() - start)
    index = {task: i for i, task in enumerate(tasks)}
    rows = [done.results[index[j, s]] | {"method": run.method, "k": run.k, "rho": rho, "seed": s}
            for j, (rho, s, run) in zip(served_by, cells)]
    tuning = dataclasses.replace(choose_rho(rows, req.cfg.evaluation_ks(), Measure.parse(ft.tune.by), ft.tune.rho,
                                            seeds), trained=len(done.trained), reused=len(tasks) - len(done.trained))
    log.info("rho_k chosen on %s: %s", ft.tune.by, ", ".join(f"k={k} {r:g}" for k, r in tuning.chosen.items()))
    return tuning


def run_protocol(req: EvaluationRequest, progress: Any, outcome: FinetuneOutcome) -> FinetuneOutcome:
    """Fine-tune every cell under each of its seeds (req.scores: each method's scores by seed, the random order may
    differ; req.given: every candidate's weight under `mixture: given`). `outcome` is filled as fine-tunes finish,
    so a caller that catches a failure still has what was done. progress: the run's progress actor handle."""
    cfg, scores = req.cfg, req.scores
    ks, seeds = cfg.evaluation_ks(), cfg.finetune.seeds()
    tuning = tune_rho(req, progress, outcome) if cfg.finetune.tune.enabled else None
    outcome.tuning = tuning.to_dict() if tuning is not None else None  # a failure from here on still records it
    plans = planned(req, seeds, tuning.rho_at if tuning else cfg.finetune.rho_at)
    cells = [(s, i) for s in seeds for i in range(len(plans[s]))]
    jobs, served_by = distinct_jobs([plans[s][i] for s, i in cells])
    job_of = dict(zip(cells, served_by))
    tasks = list(dict.fromkeys((job_of[c], c[0]) for c in cells))  # seed-major: every cell has a loss early
    log.info("%d protocol runs (%d methods x k in %s) x %d seed(s), measured on %s", len(plans[seeds[0]]),
             len(scores[seeds[0]]), ks, len(seeds), ", ".join([TARGET_VAL, *(e.name for e in req.data.evals)]))
    done = train_jobs(req, jobs, tasks, progress, outcome)
    index = {task: i for i, task in enumerate(tasks)}
    base = done.base_evaluations or {}
    rows = []
    for i in range(len(plans[seeds[0]])):  # cell by cell, each with its seeds
        for s in seeds:
            run, t = plans[s][i], index[job_of[s, i], s]
            rows.append(done.results[t] | {"label": run.label, "method": run.method, "k": run.k, "seed": s,
                                           "weights": run.weight_map(), "rho": effective_rho(run, cfg),
                                           "base_val_loss": done.base(),
                                           "base_val_accuracy": done.base(Measure(TARGET_VAL, "accuracy")),
                                           "base_evaluations": base, "reused": t not in done.trained})
    outcome.rows = rows
    outcome.evaluation = evaluation_record(req, rows, ks, len(tasks) - len(done.trained), len(done.trained))
    if outcome.tuning is not None:
        outcome.evaluation["tuning"] = outcome.tuning
    return outcome


def evaluation_record(req: EvaluationRequest, rows: list[dict], ks: list[int], reused: int, trained: int) -> dict:
    """summary.json's `evaluation`: best k, Borda and KMM's paired differences on finetune.select_by, the same on
    every evaluation and metric (`evaluations`), and the run's one verdict."""
    cfg = req.cfg
    main = Measure.parse(cfg.finetune.select_by)
    out = summarise(rows, ks, main) | {"fine_tunes": {"trained": trained, "reused": reused}}
    sets = evaluation_sets(req.data, cfg.data)
    out["evaluations"] = [summarise_measure(rows, ks, Measure(e.name, m)).to_dict()
                          | {"source": e.source, "examples": len(e.tokens)}
                          for e in sets for m in cfg.finetune.metrics]
    out["verdict"] = verdict_of(summarise_measure(rows, ks, main)).to_dict()
    if cfg.finetune.eval_every:
        out["curves"] = [c.to_dict() for c in cell_curves(rows, [e.name for e in sets])]
    return out


def run_subsets(req: EvaluationRequest, subsets: list[tuple[str, ...]], progress: Any, outcome: FinetuneOutcome,
                stage: str = "subsets") -> tuple[dict[tuple[str, ...], float], float, float | None]:
    """The loss of target + S for every subset S (once per finetune.seed; the empty subset is the target alone) on
    finetune.select_by's evaluation (the target's validation split unless it names one of data.eval), for fitted
    baselines and the faithfulness study: ({S: loss}, the target-only loss, base loss)."""
    req, seed = without_curve(req), req.cfg.finetune.seed
    jobs = [PlannedRun("subset", None, tuple(sorted(s)), rho=None) for s in dict.fromkeys([(), *subsets])]
    done = train_jobs(req, jobs, [(j, seed) for j in range(len(jobs))], progress, outcome, stage)
    measure = Measure(Measure.parse(req.cfg.finetune.select_by).evaluation, "loss")
    losses = {job.groups: measure.value(r) for job, r in zip(jobs, done.results)}
    return {tuple(sorted(s)): losses[tuple(sorted(s))] for s in subsets}, losses[()], done.base(measure)


def _deepspeed_submit(req: EvaluationRequest, jobs: list[PlannedRun], tasks: list[tuple[int, int]],
                      base: float | None, first: int | None, progress: Any):
    """submit() for finetune.strategy `deepspeed`: each job a Ray Train run of raw examples (the fine-tune model
    tokenises them itself)."""
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
