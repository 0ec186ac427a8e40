"""The driver: orchestrates one valuation run on Ray (data → gradients → Gram → KMM → select → fine-tune)."""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import socket
import time
import typing
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path

import numpy as np
import ray

from convalue.actors.dispatch import WorkItemError, windowed
from convalue.actors.embedder import embed_on_workers
from convalue.actors.finetune_job import base_eval_task, finetune_task
from convalue.actors.gradient_worker import GradientWorker
from convalue.actors.progress import Progress
from convalue.actors.solver import SolverActor, bootstrap_on_actors
from convalue.engine.config.sections import ConfigError, FeaturesConfig, RunConfig
from convalue.engine.data.clustering import EmbeddingCache
from convalue.engine.data.costs import load_costs
from convalue.engine.data.prepare import TARGET_KEY, PreparedData, prepare, preview_key
from convalue.engine.data.sources import read_parquet
from convalue.engine.features.gradients import block_tokens, plan_blocks
from convalue.engine.model.loading import check_lora_targets_in, load_tokenizer, resolve_model_dir
from convalue.engine.model.tokenize import tokenize_examples
from convalue.engine.protocol.evaluate import (
    BASELINE_METHODS,
    PlannedRun,
    distinct_jobs,
    given_weights,
    method_scores,
    mix_runs,
    plan_runs,
    summarise,
)
from convalue.engine.report.plots import plot_evaluation, plot_scores
from convalue.engine.report.tables import (
    clusters_table,
    evaluation_table,
    format_ranking,
    package_versions,
    scores_table,
    write_json,
    write_npy,
    write_parquet,
)
from convalue.engine.selection.bootstrap import outputs as bootstrap_outputs
from convalue.engine.selection.bootstrap import resample_run
from convalue.engine.selection.gram import GramReducer, cosine, metric_vectors
from convalue.engine.selection.select import select_top_k
from convalue.engine.selection.solve import solve_gram, solve_vectors
from convalue.engine.store.finetunes import FinetuneStore, job_settings
from convalue.engine.store.locks import exclusive
from convalue.engine.store.status import read_summary
from convalue.engine.store.vectors import StoreError, VectorStore, read_manifest
from convalue.solvers import KMMInputError

log = logging.getLogger("convalue")
RESULT_FILES = ("scores.parquet", "gram.npy", "beta.npy", "costs.npy", "clusters.parquet", "bootstrap.parquet",
                "evaluation.parquet", "scores.png", "evaluation.png", "summary.json")
WORKER_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


class Timer:
    """Wall time per named stage, logged, and reported to the run's progress actor once Ray is up."""

    def __init__(self, progress: Callable[[], Progress | None] = lambda: None) -> None:
        self.seconds: dict[str, float] = {}
        self.progress = progress

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        log.info("stage %s ...", name)
        if (p := self.progress()) is not None:
            p.begin(name)
        try:
            yield
        finally:
            self.seconds[name] = round(time.perf_counter() - t0, 3)
            log.info("stage %s done in %.1f s", name, self.seconds[name])
            if (p := self.progress()) is not None:
                p.end(name, self.seconds[name])


class ClusterError(RuntimeError):
    """The Ray cluster named by --address, RAY_ADDRESS or ray.address cannot be reached."""


def cluster_address(cfg: RunConfig, address: str | None) -> tuple[str, str] | None:
    """(address, where it was given) of the cluster to join: --address, else RAY_ADDRESS, else ray.address."""
    for value, source in ((address, "--address"), (os.environ.get("RAY_ADDRESS"), "RAY_ADDRESS"),
                          (cfg.ray.address, "ray.address")):
        if value:
            return value, source
    return None


def check_reachable(addr: str, source: str, timeout: float = 5.0) -> None:
    """Refuse a host:port (or ray://host:port) where nothing listens, in seconds: ray.init retries for minutes."""
    host, sep, port = addr.removeprefix("ray://").rpartition(":")
    if not sep or not host or not port.isdigit():
        return  # `auto`, or another form that Ray resolves itself
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as exc:
        raise ClusterError(f"cannot reach a Ray cluster at {addr} (given by {source}): {exc}; start one with "
                           "`ray start --head`, or give no address for an embedded cluster") from None


def connect(cfg: RunConfig, addr: str | None) -> bool:
    """Join the cluster at addr (cluster_address), or start an embedded one; True if this call started Ray."""
    if ray.is_initialized():
        return False
    if addr:
        # an existing cluster (or a Ray job's driver) owns the runtime env: passing one here conflicts
        # with the job's ("Failed to merge the Job's runtime env"); cluster/submit.sh sets HF_HUB_OFFLINE
        ray.init(address=addr)
        return True
    need = cfg.ray.workers * cfg.ray.cpus_per_worker
    kwargs = {}
    if cfg.ray.object_store_memory_mb:
        kwargs["object_store_memory"] = cfg.ray.object_store_memory_mb * 2**20
    ray.init(num_cpus=max(os.cpu_count() or 1, need), include_dashboard=cfg.ray.dashboard,
             log_to_driver=False, runtime_env={"env_vars": WORKER_ENV}, **kwargs)
    return True


def _locked(run_dir: Path) -> contextlib.AbstractContextManager:
    """The run folder's lock, refused at once (StoreError) while another run or re-solve holds it."""
    return exclusive(run_dir, busy=lambda: StoreError(
        f"{run_dir}: in use by another convalue process (a run or a re-solve); wait for it to finish, "
        "or use another run name/--out"))


def fingerprint(cfg: RunConfig, model_dir: Path) -> dict:
    """What stored vectors depend on besides each group's preview (that is in the per-group key)."""
    import transformers

    f = cfg.features
    prefix = {"task_vector": "tv_", "grpo": "grpo_"}.get(f.representation)
    # the metric is applied to stored vectors later, so vectors do not depend on it;
    # format 2: the CountSketch hash is drawn block by block (vectors of format 1 differ)
    features = {"representation": f.representation, "format": 2, "keep_per_example": f.keep_per_example} | {
        k: v for k, v in asdict(f).items() if prefix and k.startswith(prefix)}
    return {
        "features": features,
        "parameters": "full" if f.parameters == "full" else
        ("lora_A+lora_B" if f.representation == "task_vector" else "lora_B"),
        "model": cfg.model.source,
        "model_dir": model_dir.name,
        "transformers": transformers.__version__,
        "dtype": cfg.model.dtype,
        "max_length": cfg.model.max_length,
        "lora": asdict(cfg.lora) | {"dropout": 0.0},
        "projection": asdict(cfg.projection),
    }


def _worker_spec(cfg: RunConfig, model_dir: Path, pad_id: int) -> dict:
    return {"model_dir": str(model_dir), "dtype": cfg.model.dtype, "lora": asdict(cfg.lora),
            "max_length": cfg.model.max_length,
            "projection": asdict(cfg.projection), "pad_id": pad_id, "batch_size": cfg.model.batch_size,
            "token_budget": cfg.model.token_budget, "split_cost_tokens": cfg.model.split_cost_tokens,
            "threads": cfg.ray.cpus_per_worker, "device": "cuda" if cfg.ray.gpus_per_worker > 0 else "cpu",
            "finetune": asdict(cfg.finetune), "features": asdict(cfg.features)}


def featurize(cfg: RunConfig, spec: dict, data: PreparedData, store: VectorStore,
              reducer: GramReducer, progress: Progress) -> tuple[np.ndarray, dict]:
    """Compute (or reuse from the store) every group's projected gradient; returns g_tar and stats."""
    items = [data.target_item] + data.items
    keys = {it.name: preview_key(it) for it in items}
    done = store.done()
    todo = [it for it in items if done.get(it.name) != keys[it.name]]
    reused = [it.name for it in items if done.get(it.name) == keys[it.name]]
    progress.total("featurize", len(items))
    progress.advance("featurize", len(reused))
    if reused:
        X, _ = store.load(reused)
        reducer.add(reused, X)
        log.info("resumed %d stored group vectors", len(reused))
    stats = {"groups_computed": len(todo), "groups_reused": len(reused), "tokens": 0, "compute_seconds": 0.0}
    grpo = {"prompts": 0, "zero_advantage_prompts": 0, "reward_sum": 0.0}
    if todo:
        blocks = plan_blocks(todo, cfg.ray.groups_per_call)
        n_workers = min(cfg.ray.workers, len(blocks))
        opts = {"num_cpus": cfg.ray.cpus_per_worker, "num_gpus": cfg.ray.gpus_per_worker}
        workers = [GradientWorker.options(name=f"convalue-grad-{i}-{os.getpid()}", **opts).remote(spec)
                   for i in range(n_workers)]
        try:
            info = ray.get(workers[0].info.remote())
        except ray.exceptions.RayTaskError as exc:  # the replica could not be built from these inputs
            raise WorkItemError("gradient worker start-up", exc) from exc
        stats |= {"workers": n_workers, "dim_in": info["dim_in"], "dim_out": info["dim_out"]}
        log.info("%d gradient workers; %d featurised parameters (%s) -> projected to %d",
                 n_workers, info["dim_in"], cfg.features.representation, info["dim_out"])
        t0 = time.perf_counter()
        finished = 0
        try:
            for block, (names, X, st, per_example) in windowed(
                    workers, blocks, lambda w, b: w.featurize.remote(b), cfg.ray.max_in_flight * n_workers,
                    cost=block_tokens):
                store.write_block(names, [keys[n] for n in names], [len(it.examples) for it in block],
                                  [block_tokens([it]) for it in block], X, per_example)
                reducer.add(names, X)
                stats["tokens"] += st["tokens"]
                stats["compute_seconds"] += st["seconds"]
                for k in grpo if "grpo" in st else ():
                    grpo[k] += st["grpo"][k]
                finished += len(names)
                progress.advance("featurize", len(names), tokens=st["tokens"])
                log.info("featurised %d/%d groups (%s)", finished, len(todo), ", ".join(names))
        finally:
            for w in workers:
                ray.kill(w)
        wall = time.perf_counter() - t0
        stats["wall_seconds"] = round(wall, 3)
        stats["tokens_per_second"] = round(stats["tokens"] / wall, 1) if wall > 0 else None
        if cfg.features.representation == "grpo":
            stats["grpo"] = {"prompts": grpo["prompts"], "zero_advantage_prompts": grpo["zero_advantage_prompts"],
                             "mean_reward": round(grpo["reward_sum"] / max(grpo["prompts"], 1), 4)}
    store.mark_complete([it.name for it in items])
    g_tar, _ = store.load([TARGET_KEY])
    return g_tar[0], stats


GRADIENT_SPACE_MIN_N = 20_000


def solver_space(cfg: RunConfig, n: int) -> str:
    """`gram` or `gradients` (solver.space, with `auto` choosing gradients above GRADIENT_SPACE_MIN_N)."""
    if cfg.solver.space != "auto":
        return cfg.solver.space
    return "gradients" if n > GRADIENT_SPACE_MIN_N else "gram"


def check_nonzero(cfg: RunConfig, names: list[str], G: np.ndarray, g_tar: np.ndarray) -> None:
    """Refuse all-zero group vectors (a zero vector has no direction to value), saying why they arise."""
    zero = (["the target"] if not np.any(g_tar) else []) + [n for n, row in zip(names, G) if not np.any(row)]
    if not zero:
        return
    why = ("every prompt's completions got the same reward, so every advantage is 0: raise "
           "features.grpo_generations or grpo_temperature, or use a reward that separates completions"
           if cfg.features.representation == "grpo" else "the loss does not depend on the featurised parameters")
    raise ValueError(f"group vector is exactly zero for {zero[:10]} ({len(zero)} in all): {why}")


def _finetunes(cfg: RunConfig, spec: dict, tokenizer, data: PreparedData, names: list[str],
               scores: dict[int, dict[str, np.ndarray]], beta: np.ndarray, given: dict[str, float] | None,
               run_dir: Path, progress: Progress, finished: list[dict]) -> tuple[list[dict], dict]:
    """Fine-tune every cell of the evaluation protocol under each of its seeds on Ray (`scores`: each method's
    scores by seed; the random order may differ; `given`: every candidate's weight under `mixture: given`), each
    distinct selection once per seed and only when the run folder does not hold it already; (rows: one per cell
    and seed, evaluation). If the protocol fails, `finished` gains the fine-tunes it had (label, groups, seed,
    val_loss, reused), so the failed summary can say what it got."""
    groups = {g.name: g for g in data.candidates}
    tokens: dict[str, list] = {}  # each group tokenised once, however many runs use it

    def usable(name: str) -> list:
        if name not in tokens:
            toks = tokenize_examples(tokenizer, groups[name].examples, cfg.model.max_length)
            tokens[name] = [t for t in toks if t.n_response > 0]
        return tokens[name]

    ks, seeds = cfg.evaluation_ks(), cfg.finetune.seeds()
    plans = {s: plan_runs(names, scores[s], beta, ks, "target_only" in cfg.finetune.baselines, cfg.finetune.rho_at)
             for s in seeds}  # one per seed, alike but for a random order per seed
    sizes = {n: len(usable(n)) for plan in plans.values() for r in plan for n in r.groups}
    plans = {s: mix_runs(plan, cfg.finetune.mixture, scores[s], names, sizes, cfg.finetune.mixture_temperature,
                         given) for s, plan in plans.items()}
    cells = [(s, i) for s in seeds for i in range(len(plans[s]))]
    jobs, served_by = distinct_jobs([plans[s][i] for s, i in cells])
    job_of = dict(zip(cells, served_by))
    store = FinetuneStore(run_dir / "finetunes", job_settings(spec, cfg.model.source), data.target_train,
                          data.target_val)
    auxes = [{n: usable(n) for n in job.groups} for job in jobs]
    tasks = list(dict.fromkeys((job_of[c], c[0]) for c in cells))  # seed-major: every cell has a loss early
    keys = [store.job_key(auxes[j], seed, jobs[j].weight_map(), jobs[j].rho) for j, seed in tasks]
    results: list[dict | None] = [store.get(k) for k in keys]
    base = store.get_base()
    todo = [i for i, r in enumerate(results) if r is None]
    trained = set(todo)
    progress.total("finetune", len(tasks))
    progress.advance("finetune", len(tasks) - len(todo))
    log.info("%d fine-tunes for %d protocol runs (%d methods x k in %s) x %d seed(s); %d stored in %s", len(tasks),
             len(plans[seeds[0]]), len(scores[seeds[0]]), ks, len(seeds), len(tasks) - len(todo), store.root)
    opts = {"num_cpus": cfg.ray.cpus_per_worker, "num_gpus": cfg.ray.gpus_per_worker}
    train, val = ray.put(data.target_train), ray.put(data.target_val)

    def submit(n: int, i: int):
        j, seed = tasks[i]
        rho = {} if jobs[j].rho is None else {"rho": jobs[j].rho}
        seeded = spec | {"finetune": spec["finetune"] | {"seed": seed} | rho}
        return finetune_task.options(**opts).remote(seeded, jobs[j].label, train, auxes[j], val,
                                                    base is None and n == 0, jobs[j].weight_map())

    refs = {submit(n, i): i for n, i in enumerate(todo)}
    if base is None and not todo:
        refs[base_eval_task.options(**opts).remote(spec, val)] = -1
    pending = list(refs)
    try:
        while pending:
            [done], pending = ray.wait(pending, num_returns=1)
            i = refs[done]
            if i < 0:
                base = ray.get(done)
                store.put_base(base)
                continue
            results[i] = ray.get(done).to_dict()
            store.put(keys[i], results[i])
            progress.advance("finetune")
            if results[i]["base_val_loss"] is not None:
                base = results[i]["base_val_loss"]
                store.put_base(base)
            log.info("fine-tune %d/%d done: %s (seed %d), validation loss %.4f", len(todo) - len(pending), len(todo),
                     jobs[tasks[i][0]].label, tasks[i][1], results[i]["val_loss"])
    except BaseException:  # one failed (or Ctrl-C): the protocol is incomplete, so stop the others
        for ref in pending:
            ray.cancel(ref)
        finished.extend({"label": jobs[j].label, "groups": list(jobs[j].groups), "weights": jobs[j].weight_map(),
                         "rho": _effective_rho(jobs[j], cfg), "seed": seed, "val_loss": results[i]["val_loss"],
                         "reused": i not in trained}
                        for i, (j, seed) in enumerate(tasks) if results[i] is not None)
        raise
    index = {task: i for i, task in enumerate(tasks)}
    rows = []
    for i in range(len(plans[seeds[0]])):  # cell by cell, each with its seeds
        for s in seeds:
            run, t = plans[s][i], index[job_of[s, i], s]
            rows.append(results[t] | {"label": run.label, "method": run.method, "k": run.k, "seed": s,
                                      "weights": run.weight_map(), "rho": _effective_rho(run, cfg),
                                      "base_val_loss": base, "reused": t not in trained})
    return rows, summarise(rows, ks) | {"fine_tunes": {"trained": len(todo), "reused": len(tasks) - len(todo)}}


def _effective_rho(run: PlannedRun, cfg: RunConfig) -> float:
    """The share of target steps a run was drawn with: its rho_k, finetune.rho, or 1 with no group bought."""
    return 1.0 if not run.groups else run.rho if run.rho is not None else cfg.finetune.rho


def _bootstrap(cfg: RunConfig, store: VectorStore, names: list[str], w: np.ndarray, beta: np.ndarray,
               selected: list[int], run: dict, progress: Progress) -> tuple[object, dict]:
    """Resample the previews bootstrap.samples times, spread over ray.workers solver actors; (bootstrap.parquet's
    table, summary). Each resample has its own seed, so the result does not depend on the spread."""
    progress.total("bootstrap", cfg.bootstrap.samples)
    W, S = bootstrap_on_actors(store.load_examples(names + [TARGET_KEY]), names, run, cfg.bootstrap.samples,
                               cfg.bootstrap.seed, cfg.ray.workers, cfg.ray.cpus_per_worker,
                               on_part=lambda count: progress.advance("bootstrap", count))
    table, stats = bootstrap_outputs(names, w, beta, selected, W, S, cfg.bootstrap.seed)
    log.info("bootstrap: %d resamples of the previews; the selection came out again in %.0f %% of them",
             len(W), 100 * stats["same_selection"])
    return table, stats


def run(cfg: RunConfig, *, address: str | None = None, overwrite: bool = False) -> dict:
    """Run the whole valuation; returns the summary (also written to <out>/<name>/summary.json)."""
    joined = cluster_address(cfg, address)
    if joined and not ray.is_initialized():
        check_reachable(*joined)  # before the model and data stages, not after them
    session = RaySession(cfg, joined[0] if joined else None)
    try:
        return _run(cfg, overwrite, session)
    finally:
        session.close()


class RaySession:
    """The run's Ray: connected once, when a stage first needs it; shut down at the end only if the run started it."""

    def __init__(self, cfg: RunConfig, addr: str | None):
        self.cfg, self.addr, self.connected, self.started = cfg, addr, False, False
        self.progress: Progress | None = None

    def up(self) -> None:
        """Connect (or start an embedded Ray) unless already done, and start the run's progress actor."""
        if not self.connected:
            self.started, self.connected = connect(self.cfg, self.addr), True
            self.progress = Progress(self.cfg.name)

    def close(self) -> None:
        """Stop the progress actor; shut down a Ray this run started."""
        if self.progress is not None:
            self.progress.close()
        if self.started:
            ray.shutdown()


def _run(cfg: RunConfig, overwrite: bool, session: RaySession) -> dict:
    timer = Timer(lambda: session.progress)
    t_start = time.perf_counter()
    if cfg.model.dtype == "bfloat16" and cfg.ray.gpus_per_worker == 0:
        log.warning("model.dtype bfloat16 on CPU workers (ray.gpus_per_worker 0): bf16 matmuls on a CPU without "
                    "bf16 units run about 25x slower than float32 (measured on this project's AVX2 machine)")
    with timer.stage("model"):
        model_dir = resolve_model_dir(cfg.model)
        tokenizer = load_tokenizer(model_dir)
        if cfg.features.parameters == "lora":
            check_lora_targets_in(model_dir, cfg.lora)
    run_dir = Path(cfg.out).expanduser() / cfg.name
    embed = None
    if any(src.clusters is not None for src in cfg.data.candidates):
        # a flat pool is embedded on Ray workers, so Ray starts before the data stage; embeddings kept in the
        # run folder (content-keyed) spare a rerun of the same pool, with another k or seed too, the embedding
        with timer.stage("ray_init"):
            session.up()
        embed = EmbeddingCache(run_dir / "embeddings", functools.partial(
            embed_on_workers, workers=cfg.ray.workers, cpus_per_worker=cfg.ray.cpus_per_worker,
            max_in_flight=cfg.ray.max_in_flight))
    with timer.stage("data"):
        data = prepare(cfg.data, tokenizer, cfg.model.max_length, grpo=cfg.features.representation == "grpo",
                       embed=embed)
        costs = load_costs(cfg.solver.costs_file, data.names()) if cfg.solver.costs_file else None
        given = None  # `mixture: given`: every candidate's weight, checked before the hours of featurisation
        if cfg.finetune.enabled and cfg.finetune.mixture_weights is not None:
            given = given_weights(cfg.finetune.mixture_weights, data.names(), cfg.finetune.mixture_default_weight)
    run_dir.mkdir(parents=True, exist_ok=True)
    with _locked(run_dir):  # no other run or re-solve writes here meanwhile
        store = VectorStore(run_dir / "vectors", fingerprint(cfg, model_dir), overwrite=overwrite)
        for f in RESULT_FILES:  # results of an earlier run in this folder are replaced, never mixed
            (run_dir / f).unlink(missing_ok=True)
        if embed is not None:
            embed.save(write_npy)
        clusters = clusters_table(data.resolved, set(data.names()))
        if clusters is not None:  # a flat pool's clusters: which example went where (before featurisation)
            write_parquet(clusters, run_dir / "clusters.parquet")
        summary: dict = {"status": "running", "config": cfg.to_dict(), "packages": package_versions(),
                         "data": {"target": data.target.name, "target_train": len(data.target_train),
                                  "target_val": len(data.target_val), "target_preview": len(data.target_item.examples),
                                  "candidates": len(data.items), "warnings": data.warnings}}
        if clusters is not None:
            sizes = [len(g.examples) for g in data.resolved if g.members is not None]
            summary["data"]["clusters"] = {"groups": len(sizes), "examples": sum(sizes), "smallest": min(sizes),
                                           "largest": max(sizes), "pools_reusing_embeddings": embed.hits}
        write_json(summary, run_dir / "summary.json")  # "running" until the end: a killed run does not look finished
        stage = "ray_init"
        finished: list[dict] = []  # the fine-tunes done so far, listed in a failed summary
        try:
            if not session.connected:  # a flat pool connected before the data stage
                with timer.stage("ray_init"):
                    session.up()
            spec = _worker_spec(cfg, model_dir, tokenizer.pad_token_id)
            names = data.names()
            space = solver_space(cfg, len(names))
            reducer = GramReducer(tiles=space == "gram")
            stage = "featurize"
            with timer.stage("featurize"):
                g_tar, fstats = featurize(cfg, spec, data, store, reducer, session.progress)
            summary["featurize"] = fstats
            stage = "gram"
            with timer.stage("gram"):
                G = reducer.vectors(names)
                check_nonzero(cfg, names, G, g_tar)
                Gm, gm, M = metric_vectors(cfg.features.metric, G, g_tar)  # the vectors in the run's metric
                if M is not None:
                    summary["metric"] = {"kind": cfg.features.metric, "support": int(np.count_nonzero(M)),
                                         "max_over_mean": round(float(M.max()), 3)}
                beta = Gm @ gm
                if space == "gradients":
                    K = None
                else:  # the Euclidean Gram was reduced while blocks arrived; another metric is formed here
                    K = reducer.gram(names) if M is None else Gm @ Gm.T
            summary["order"] = names  # row order of gram.npy / beta.npy
            summary["space"] = space
            stage = "solve"
            # K = Gm Gm^T has rank <= p: the bound lets validation compute the rank beyond N = 8000 (or stands in for
            # it), and the solver needs the rank when N > p (bench/rank_deficient.py)
            settings = {"gamma": cfg.solver.gamma, "budget": cfg.solver.budget, "method": cfg.solver.method,
                        "normalize": cfg.solver.normalize, "costs": costs, "rank_bound": int(Gm.shape[1]),
                        "tol": cfg.solver.tol}
            with timer.stage("solve"):
                solver = SolverActor.remote()
                try:
                    call = (solver.solve.remote(ray.put(K), ray.put(beta), settings) if K is not None
                            else solver.solve_gradients.remote(ray.put(Gm), ray.put(gm), settings))
                    sol = ray.get(call)
                finally:
                    ray.kill(solver)
            summary["solver"] = sol.summary() | {"normalize": cfg.solver.normalize, "rank_bound": settings["rank_bound"]}
            w = sol.w
            selected = select_top_k(w, beta, cfg.select.k)
            if cfg.bootstrap.samples:
                stage = "bootstrap"
                with timer.stage("bootstrap"):
                    boot, summary["bootstrap"] = _bootstrap(cfg, store, names, w, beta, selected,
                                                            {"metric": cfg.features.metric, "space": space,
                                                             "settings": settings, "k": cfg.select.k},
                                                            session.progress)
            n_examples = [len(g.examples) for g in data.candidates]
            cos = cosine(G, g_tar)
            table = scores_table(names, n_examples, [len(it.examples) for it in data.items], w, beta, cos,
                                 selected)
            plot_scores(table, run_dir / "scores.png")  # first: a figure that fails leaves no scores behind
            if K is not None:
                write_npy(K, run_dir / "gram.npy")
            write_npy(beta, run_dir / "beta.npy")
            if costs is not None:
                write_npy(costs, run_dir / "costs.npy")
            write_parquet(table, run_dir / "scores.parquet")
            if cfg.bootstrap.samples:
                write_parquet(boot, run_dir / "bootstrap.parquet")
            summary["selected"] = [names[i] for i in selected]
            summary["ranking"] = format_ranking(table).splitlines()
            stage = "finetune"
            results: list[dict] = []
            if cfg.finetune.enabled:
                with timer.stage("finetune"):
                    methods = ["kmm"] + [b for b in cfg.finetune.baselines if b in BASELINE_METHODS]
                    scores = {s: method_scores(methods, w, beta, cos, cfg.finetune.random_order_seed(s))
                              for s in cfg.finetune.seeds()}
                    results, summary["evaluation"] = _finetunes(cfg, spec, tokenizer, data, names, scores, beta,
                                                                given, run_dir, session.progress, finished)
                plot_evaluation(results, summary["evaluation"], run_dir / "evaluation.png")
                write_parquet(evaluation_table(results), run_dir / "evaluation.parquet")
            summary["finetune"] = results
            summary["status"] = "complete"
        except BaseException as exc:
            summary["status"] = "failed"
            summary["failed_stage"] = stage
            if stage == "finetune" and finished:  # kept in finetunes/ too, so a rerun trains only the rest
                summary["finetune_finished"] = finished
            summary["error"] = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            summary["timings_s"] = timer.seconds | {"total": round(time.perf_counter() - t_start, 3)}
            if session.progress is not None and (snap := session.progress.snapshot()) is not None:
                summary["progress"] = snap["stages"]  # how far each stage got: of interest when one failed
            write_json(summary, run_dir / "summary.json")
    return summary


def _stored_vectors(run_dir: Path, summary: dict) -> tuple[np.ndarray, np.ndarray]:
    """(G, g_tar) of a finished run from its vector store, in the run's metric and row order."""
    root = run_dir / "vectors"
    store = VectorStore(root, read_manifest(root)["fingerprint"])
    G, _ = store.load(summary["order"])
    g_tar = store.load([TARGET_KEY])[0][0].astype(np.float64)
    G, g_tar, _ = metric_vectors(_metric(summary), G, g_tar)
    return G, g_tar


def _load_saved(path: Path) -> np.ndarray:
    """A saved .npy array of a run folder, or a StoreError naming the file."""
    try:
        with open(path, "rb") as fh:
            if fh.read(6) != b"\x93NUMPY":
                raise ValueError("no .npy header")
            fh.seek(0)
            return np.load(fh, allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:
        raise StoreError(f"{path}: not a readable .npy array ({exc})") from None


def _saved_summary(run_dir: Path) -> dict:
    """summary.json of a finished run folder, checked for what a re-solve reads; errors name the file and field."""
    path = run_dir / "summary.json"
    summary = read_summary(run_dir, "not a finished run folder (summary.json needed)")
    if summary.get("status") == "running":  # a live run holds the folder's lock, so this one was killed
        raise StoreError(f"{path}: field `status` is \"running\": the run was stopped before it finished "
                         "(run it again with `convalue run`)")
    marker = summary.get("resolving")
    if summary.get("status") == "resolving" and not (isinstance(marker, dict) and isinstance(marker.get("status"), str)):
        raise StoreError(f"{path}: field `resolving.status` must name the status before the interrupted re-solve")
    order = summary.get("order")
    if (not isinstance(order, list) or not order or not all(isinstance(n, str) for n in order)
            or len(set(order)) != len(order)):
        raise StoreError(f"{path}: field `order` must list the run's candidate names, each once "
                         f"(got {json.dumps(order)[:80]})")
    try:
        k = summary["config"]["select"]["k"]
    except (KeyError, TypeError):
        k = None
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise StoreError(f"{path}: field `config.select.k` must be an integer >= 1 (got {json.dumps(k)})")
    solver, tunes = summary.get("solver") or {}, summary.get("finetune") or []
    ok = {"solver": isinstance(solver, dict),
          "finetune": isinstance(tunes, list) and all(
              isinstance(t, dict) and isinstance(t.get("groups"), list)
              and (t.get("method") != "kmm" or (type(t.get("k")) is int and t["k"] >= 1))
              and _weights_ok(t.get("weights"), t["groups"]) for t in tunes),
          "space": summary.get("space", "gram") in ("gram", "gradients"),
          "config.features.metric": summary.get("space") != "gradients" or _metric(summary) in METRICS}
    if bad := [name for name, good in ok.items() if not good]:
        raise StoreError(f"{path}: field `{bad[0]}` is malformed")
    return summary


def _weights_ok(weights: object, groups: list) -> bool:
    """A fine-tune row's mixture weights: absent (uniform) or a number for each of its groups."""
    return weights is None or (isinstance(weights, dict) and set(weights) == set(groups) and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) for v in weights.values()))


def _resolve_bootstrap(run_dir: Path, summary: dict, w: np.ndarray, beta: np.ndarray, selected: list[int],
                       settings: dict) -> tuple[object, dict]:
    """The run's bootstrap (same samples and seed) for a re-solve's settings, in this process; (table, summary)."""
    path = run_dir / "summary.json"
    boot = summary["config"].get("bootstrap")
    samples, seed = (boot.get("samples"), boot.get("seed")) if isinstance(boot, dict) else (None, None)
    if type(samples) is not int or samples < 1 or type(seed) is not int:
        raise StoreError(f"{path}: field `config.bootstrap` must hold samples >= 1 and an integer seed "
                         f"(got {json.dumps(boot)[:80]})")
    names = summary["order"]
    root = run_dir / "vectors"
    examples = VectorStore(root, read_manifest(root)["fingerprint"]).load_examples(names + [TARGET_KEY])
    run = {"metric": _metric(summary), "space": summary.get("space", "gram"), "settings": settings,
           "k": summary["config"]["select"]["k"]}
    W, S = resample_run(examples, names, run, samples, seed)
    return bootstrap_outputs(names, w, beta, selected, W, S, seed)


def _kmm_runs(summary: dict) -> list[dict]:
    """The saved fine-tune rows of KMM's selections, each with its k (a summary written before the evaluation
    protocol lists KMM's top-select.k run first, without `method` and `k`)."""
    rows = summary.get("finetune") or []
    if rows and "method" not in rows[0]:
        return [rows[0] | {"k": summary["config"]["select"]["k"]}]
    return [r for r in rows if r.get("method") == "kmm"]


def _kmm_changed(summary: dict, names: list[str], w: np.ndarray, beta: np.ndarray) -> list[int]:
    """The evaluated k whose KMM fine-tunes no longer match the solution w: other groups bought or, with
    finetune.mixture softmax, other mixture weights."""
    tuned = summary["config"].get("finetune") or {}
    changed = set()
    for r in {r["k"]: r for r in _kmm_runs(summary)}.values():  # one row per k: its seeds share groups and weights
        groups = tuple(sorted(names[i] for i in select_top_k(w, beta, r["k"])))
        if list(groups) != r["groups"]:
            changed.add(r["k"])
        elif tuned.get("mixture") == "softmax":
            (now,) = mix_runs([PlannedRun("kmm", r["k"], groups)], "softmax", {"kmm": w}, names, {},
                              tuned.get("mixture_temperature", 1.0))
            old = r.get("weights")
            if (now.weights is None) != (old is None) or (old is not None and not np.allclose(
                    [old[g] for g in groups], now.weights, rtol=1e-9, atol=0)):
                changed.add(r["k"])
    return sorted(changed)


METRICS = typing.get_args(typing.get_type_hints(FeaturesConfig)["metric"])  # features.metric's allowed values


def _metric(summary: dict) -> object:
    """The run's features.metric as recorded in its summary (None where the entry is missing)."""
    features = summary["config"].get("features")
    return features.get("metric") if isinstance(features, dict) else None


def _saved_scores(run_dir: Path, order: list[str]) -> dict[str, dict]:
    """scores.parquet's rows by group, which must be exactly the groups of summary.json's order."""
    path = run_dir / "scores.parquet"
    if not path.is_file():
        raise StoreError(f"{path}: missing (the run folder is incomplete)")
    table = read_parquet(path, StoreError)
    needed = ["group", "n_examples", "n_preview", "cosine"]
    if missing := [c for c in needed if c not in table.column_names]:
        raise StoreError(f"{path}: missing column(s) {missing}")
    rows = table.select(needed).to_pylist()
    by_name = {r["group"]: r for r in rows}
    if len(rows) != len(order) or set(by_name) != set(order):
        extra, absent = sorted(set(by_name) - set(order)), sorted(set(order) - set(by_name))
        raise StoreError(f"{path}: its {len(rows)} rows do not match summary.json's order of {len(order)} groups "
                         f"(not in order: {extra[:5]}, no row: {absent[:5]})")
    return by_name


def resolve(run_dir: Path, *, gamma: float | None, budget: float | None, method: str | None,
            normalize: str | None, tol: float | None = None) -> dict:
    """Re-solve a saved run (no gradients recomputed) from gram.npy/beta.npy, or from its stored vectors when
    it was solved in gradient space; rewrites its scores. Everything is read and checked before anything is written.
    tol: as `solver.tol`; None keeps the run's own where the form stays penalised with convalue's solver."""
    if not run_dir.is_dir():
        raise FileNotFoundError(f"{run_dir}: not a finished run folder (no such folder)")
    with _locked(run_dir):
        return _resolve(run_dir, gamma=gamma, budget=budget, method=method, normalize=normalize, tol=tol)


def _resolve(run_dir: Path, *, gamma: float | None, budget: float | None, method: str | None,
             normalize: str | None, tol: float | None = None) -> dict:
    summary = _saved_summary(run_dir)
    names = summary["order"]  # the row order of gram.npy and beta.npy
    space = summary.get("space", "gram")
    if space == "gram" and not (run_dir / "gram.npy").is_file():
        raise FileNotFoundError(f"{run_dir}: not a finished run folder (gram.npy needed)")
    old = summary.get("solver") or {}
    if gamma is None and budget is None:
        gamma, budget = old.get("gamma"), old.get("budget")
    normalize = normalize or old.get("normalize", "none")
    own_solver = method in (None, "auto", "active_set")  # convalue's, not the CVXPY reference
    if tol is None and gamma is not None and own_solver:
        tol = old.get("tol")  # the run's own stopping tolerance, where it still applies
    if space != "gram" and not own_solver:
        raise ConfigError(f"{run_dir} was solved in gradient space (no gram.npy); this method needs the Gram",
                          field="method", value=method)
    files = ["beta.npy"] + (["gram.npy"] if space == "gram" else []) + (
        ["costs.npy"] if (run_dir / "costs.npy").is_file() else [])
    arrays = {name: _load_saved(run_dir / name) for name in files}
    beta, costs = arrays["beta.npy"], arrays.get("costs.npy")
    if beta.ndim != 1 or len(beta) != len(names):
        raise StoreError(f"{run_dir / 'beta.npy'}: shape {beta.shape}, but summary.json's order lists "
                         f"{len(names)} groups")
    prev = _saved_scores(run_dir, names)
    settings = {"gamma": gamma, "budget": budget, "costs": costs, "method": method or "auto", "normalize": normalize,
                "rank_bound": old.get("rank_bound"), "tol": tol}
    try:
        if space == "gram":
            sol = solve_gram(arrays["gram.npy"], beta, settings)
        else:
            sol = solve_vectors(*_stored_vectors(run_dir, summary), settings)
    except KMMInputError as exc:  # name the saved files the bad values came from
        sources = files + ([] if space == "gram" else ["vectors/"])
        raise KMMInputError(f"{run_dir} ({', '.join(sources)}): {exc}") from None
    k = summary["config"]["select"]["k"]
    selected = select_top_k(sol.w, beta, k)
    cos = np.array([prev[n]["cosine"] for n in names])  # a property of the gradients, not of the solve
    table = scores_table(names, [prev[n]["n_examples"] for n in names], [prev[n]["n_preview"] for n in names],
                         sol.w, beta, cos, selected)
    boot = boot_stats = None
    if summary.get("bootstrap"):  # the run's bootstrap, redone for the new solve (else it would describe the old)
        boot, boot_stats = _resolve_bootstrap(run_dir, summary, sol.w, beta, selected, settings)
    # the files below are rewritten one by one: until the summary is final it says so, and a re-solve that was
    # stopped midway reads back as "resolving" (a rerun of `convalue solve` finishes it)
    status = summary["resolving"]["status"] if summary.get("status") == "resolving" else summary.get("status")
    write_json(summary | {"status": "resolving", "resolving": {
        "status": status, "gamma": gamma, "budget": budget, "method": method or "auto", "normalize": normalize}
        | ({"tol": tol} if tol is not None else {})},
        run_dir / "summary.json")
    plot_scores(table, run_dir / "scores.png")  # first, as in a run: a failed figure leaves the scores as they were
    write_parquet(table, run_dir / "scores.parquet")
    if boot is not None:
        write_parquet(boot, run_dir / "bootstrap.parquet")
        summary["bootstrap"] = boot_stats
    summary["solver"] = sol.summary() | {"normalize": normalize} | (
        {"rank_bound": old["rank_bound"]} if old.get("rank_bound") else {})
    summary["selected"] = [names[i] for i in selected]
    summary["ranking"] = format_ranking(table).splitlines()
    # a re-solve that changes what KMM buys at any evaluated k (or its softmax mixture) leaves those fine-tunes
    # (and best-k, Borda) stale; one back to the tuned selections makes them current again
    changed = _kmm_changed(summary, names, sol.w, beta)
    if changed:
        summary["finetune_stale"] = (f"the re-solve changed what KMM buys at k = {changed}; fine-tune results "
                                     "(and best k, Borda) are for the old selection")
    else:
        summary.pop("finetune_stale", None)
    summary["resolved"] = True
    summary["status"] = status
    summary.pop("resolving", None)
    write_json(summary, run_dir / "summary.json")
    return summary
