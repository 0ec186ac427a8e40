"""Featurisation benchmark on SmolLM2 + chatterbot groups: the paper's naive loop vs convalue on Ray, in one run.

(a) naive: per group, batch size 1, one backward per example, full-vocabulary logits, CPU copy, mean
    (as the paper's reference code does it), 1 thread;
(b) convalue, 1 gradient worker with 1 thread (token-budget packing across groups, per-example
    gradients from one backward, LM head only on response tokens);
(c) convalue, 2 gradient workers with 1 thread each.
Each of --rounds rounds times (a), (b) and (c) in turn (the two workers stay up; (b) uses one of them); the best
time of each gives the ratios, as timeit does, and the medians are printed beside them. Checks that (a) and (b)
give the same group vectors, prints tokens/s and ratios, and ends with one JSON line.

    .venv/bin/python bench/featurize.py [--groups 16 --m 4 --max-length 64 --groups-per-call 4 --rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def naive_group_gradient(model, params, examples, pad_id: int, device: str = "cpu") -> tuple[np.ndarray, float]:
    """The reference loop: batch size 1, full logits, backward per example, copy to CPU, mean."""
    import torch

    from convalue.engine.data.tokenize import IGNORE
    from convalue.engine.features.batching import pad_batch

    total = None
    backward_s = 0.0
    for ex in examples:
        ids, mask, labels = (t.to(device) for t in pad_batch([ex], pad_id))
        t0 = time.perf_counter()
        logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1),
                                                 ignore_index=IGNORE)
        loss.backward()
        backward_s += time.perf_counter() - t0
        g = torch.cat([p.grad.reshape(-1) for p in params]).cpu().numpy().copy()
        for p in params:
            p.grad = None
        total = g if total is None else total + g
    return total / len(examples), backward_s


LANGS = ["english", "spanish", "german", "italian", "portuguese", "dutch", "french", "swedish", "turkish",
         "indonesian", "russian", "hindi", "bengali", "hebrew", "chinese", "japanese", "korean", "persian"]


def bench_items(tok, groups: int, m: int, max_length: int) -> list:
    """The first `groups` chatterbot languages as candidate groups of m examples (marathi is the target)."""
    from convalue.engine.config import DataConfig, SourceConfig
    from convalue.engine.data.prepare import prepare

    return prepare(DataConfig(target=SourceConfig(kind="chatterbot", include=["marathi"]),
                              candidates=[SourceConfig(kind="chatterbot", include=LANGS[:groups])],
                              preview_size=m, small_groups="keep"), tok, max_length).items


def grpo_bench_items(tok, prompts: int, max_length: int) -> list:
    """Two mathematics modules (arithmetic__mul, numbers__gcd) as GRPO candidate groups of `prompts` prompts."""
    from convalue.engine.config import DataConfig, SourceConfig
    from convalue.engine.data.prepare import prepare

    return prepare(DataConfig(
        target=SourceConfig(kind="mathematics", include=["arithmetic__add_or_sub"], examples_per_group=16),
        candidates=[SourceConfig(kind="mathematics", include=["arithmetic__mul", "numbers__gcd"], examples_per_group=16)],
        preview_size=prompts), tok, max_length, grpo=True).items


def worker_spec(model_dir, pad_id: int, token_budget: int, *, dim: int = 8192, device: str = "cpu",
                max_length: int = 128, split_cost_tokens: int | None = None):
    """The ReplicaSpec a GradientWorker (or build_featurizer) gets in the benches: float32, the default LoRA and
    features, CountSketch to dim (seed 0), batches of token_budget tokens, 1 thread."""
    from convalue.engine.config import (
        FeaturesConfig,
        FinetuneConfig,
        LoraConfig,
        ModelConfig,
        ProjectionConfig,
    )
    from convalue.engine.model.spec import ReplicaSpec

    model = ModelConfig(source=str(model_dir), dtype="float32", batch_size=8, max_length=max_length,
                        token_budget=token_budget, split_cost_tokens=split_cost_tokens)
    return ReplicaSpec(model_dir=str(model_dir), model=model, lora=LoraConfig(), features=FeaturesConfig(),
                       projection=ProjectionConfig(kind="countsketch", dim=dim, seed=0), finetune=FinetuneConfig(),
                       pad_id=pad_id, threads=1, device=device)


def variant(spec, *, dtype: str | None = None, device: str | None = None, **features):
    """`spec` with another dtype, device or features fields (e.g. representation="task_vector")."""
    from dataclasses import replace

    from convalue.engine.config import FeaturesConfig

    out = replace(spec, features=FeaturesConfig(**features)) if features else spec
    if dtype is not None:
        out = replace(out, model=replace(out.model, dtype=dtype))
    return replace(out, device=device) if device is not None else out


def grpo_spec(spec, generations: int = 8):
    """`spec` with the GRPO representation of the benches: numeric_closeness reward, G = `generations`, 24 new
    tokens."""
    return variant(spec, representation="grpo", grpo_reward="numeric_closeness", grpo_generations=generations,
                   grpo_max_new_tokens=24)


def min_cosine(A: dict[str, np.ndarray], B: dict[str, np.ndarray]) -> float:
    """Smallest cosine between same-named vectors of A and B (over B's names)."""
    return min(float(A[n] @ B[n] / (np.linalg.norm(A[n]) * np.linalg.norm(B[n]))) for n in B)


def start_ray(num_cpus: int) -> None:
    """An embedded Ray for the bench (no dashboard, workers offline)."""
    import ray

    ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=False, configure_logging=False,
             _node_ip_address="127.0.0.1", runtime_env={"env_vars": {"HF_HUB_OFFLINE": "1"}})


def start_workers(spec, n_workers: int, warmup: list, num_gpus: float = 0.0) -> tuple[list, float]:
    """(n_workers GradientWorkers, their start-up seconds), each then warmed up on the work items `warmup`."""
    import ray

    from convalue.actors.gradient_worker import GradientWorker

    t0 = time.perf_counter()
    workers = [GradientWorker.options(num_cpus=1, num_gpus=num_gpus).remote(spec) for _ in range(n_workers)]
    ray.get([w.info.remote() for w in workers])
    startup = time.perf_counter() - t0
    ray.get([w.featurize.remote(warmup, ["warm-up"] * len(warmup))[0] for w in workers])
    return workers, startup


def time_blocks(workers: list, blocks: list) -> tuple[float, dict[str, np.ndarray], list[float], list[float]]:
    """(seconds, vectors by group, each worker's busy seconds, each block's seconds in the order of `blocks`) of
    `blocks` on `workers`, dispatched as the pipeline does (longest first, to the worker with the fewest
    outstanding tokens, two calls in flight each)."""
    import ray

    from convalue.actors.pool import windowed
    from convalue.engine.features.batching import block_tokens

    index = {id(b): i for i, b in enumerate(blocks)}
    t0 = time.perf_counter()
    out, busy, per_block, arrays = {}, {}, [0.0] * len(blocks), {}

    def call(w, b):  # the block's metadata now, its vectors by reference (as the pipeline keeps them)
        meta, X = w.featurize.remote(b, [it.name for it in b])
        arrays[id(b)] = X
        return meta

    for block, done in windowed(workers, blocks, call, 2 * len(workers), cost=block_tokens):
        out.update(zip(done.names, ray.get(arrays.pop(id(block)))))
        busy[done.stats["pid"]] = busy.get(done.stats["pid"], 0.0) + done.stats["seconds"]
        per_block[index[id(block)]] = done.stats["seconds"]
    return time.perf_counter() - t0, out, sorted(busy.values()), per_block


def ray_cpu_share(seconds: float) -> dict[str, float]:
    """CPU time of this driver's Ray processes (its descendants: raylet, GCS, agents, log monitor, actors) over
    `seconds` of wall time, as shares of one core by process name; call it while no work runs to see Ray's own
    overhead."""
    import psutil

    def snapshot() -> dict[int, tuple[str, float]]:
        out = {}
        for proc in psutil.Process().children(recursive=True):  # an embedded Ray's processes are all ours
            try:
                cmd = proc.cmdline()
                if not cmd:
                    continue
                if cmd[0].startswith("ray::"):
                    name = cmd[0].split()[0]
                else:  # a Ray binary, or python [-u] running a script of Ray's (log monitor, dashboard, ...)
                    path = next((c for c in cmd[:3] if "/site-packages/ray/" in c), cmd[0])
                    name = Path(path).stem
                t = proc.cpu_times()
                out[proc.pid] = (name, t.user + t.system)
            except psutil.Error:
                continue
        return out

    before, t0 = snapshot(), time.perf_counter()
    time.sleep(seconds)
    after, wall = snapshot(), time.perf_counter() - t0
    shares: dict[str, float] = {}
    for pid, (name, cpu) in after.items():
        if pid in before:
            shares[name] = shares.get(name, 0.0) + (cpu - before[pid][1]) / wall
    return dict(sorted(shares.items(), key=lambda kv: -kv[1]))


def featurize_on_ray(spec, blocks: list, n_workers: int, num_gpus: float = 0.0
                     ) -> tuple[float, float, dict[str, np.ndarray], list[float]]:
    """(seconds, worker start-up seconds, vectors by group, each worker's busy seconds) of `blocks` on
    n_workers fresh GradientWorkers (a warm-up call first, then timed); the workers are killed after."""
    import ray

    workers, startup = start_workers(spec, n_workers, blocks[0][:1], num_gpus)
    elapsed, out, busy, _ = time_blocks(workers, blocks)
    for w in workers:
        ray.kill(w)
    return elapsed, startup, out, busy


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--groups", type=int, default=16)
    ap.add_argument("--groups-per-call", type=int, default=4, help="as ray.groups_per_call")
    ap.add_argument("--m", type=int, default=4)
    ap.add_argument("--max-length", type=int, default=64)
    ap.add_argument("--token-budget", type=int, default=2048, help="as model.token_budget")
    ap.add_argument("--dim", type=int, default=8192)
    ap.add_argument("--split-cost-tokens", type=int, default=None, help="as model.split_cost_tokens (a huge value: no cuts)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds of (a), (b), (c); the best of each is reported")
    ap.add_argument("--model", default="smollm2-135m-instruct",
                    help="model.source: the built-in SmolLM2-135M or a local Hugging Face folder (the tests pass a tiny one)")
    ap.add_argument("--ray-idle-s", type=float, default=20.0,
                    help="seconds to sample the CPU use of Ray's own processes with every actor idle (0: skip)")
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error(f"--rounds must be >= 1, got {args.rounds}")

    import ray
    import torch

    from convalue.engine.config import (
        FeaturesConfig,
        ModelConfig,
    )
    from convalue.engine.features.batching import block_tokens, plan_blocks
    from convalue.engine.features.projection import make_projector
    from convalue.engine.features.replica import featurised_parameters
    from convalue.engine.model.loading import load_model, load_tokenizer, resolve_model_dir

    model_dir = resolve_model_dir(ModelConfig(source=args.model))
    tok = load_tokenizer(model_dir)
    items = bench_items(tok, args.groups, args.m, args.max_length)
    tokens = sum(len(e) for it in items for e in it.examples)
    spec = worker_spec(model_dir, tok.pad_token_id, args.token_budget, dim=args.dim,
                       split_cost_tokens=args.split_cost_tokens)
    lora, proj_cfg = spec.lora, spec.projection

    # every round times (a), (b) and (c) in turn, so a slow spell of this shared host hits all three alike
    torch.set_num_threads(1)
    model, named = featurised_parameters(load_model(model_dir), FeaturesConfig(), lora)  # lora_B, as the workers
    params = [p for _, p in named]
    d = sum(p.numel() for p in params)
    projector = make_projector(proj_cfg.kind, d, proj_cfg.dim, proj_cfg.seed)
    naive_group_gradient(model, params, items[0].examples[:1], tok.pad_token_id)  # warm-up

    # two workers stay up across rounds, each on 1 torch thread: (b) uses the first alone, (c) both, so no
    # third, idle actor takes CPU time from (c)
    start_ray(2)
    blocks = plan_blocks(items, args.groups_per_call)  # as the pipeline plans them
    pool2, startup_s = start_workers(spec, 2, blocks[0][:1])
    pool1 = pool2[:1]

    times: dict[str, list[float]] = {"a": [], "b": [], "c": []}
    busy: dict[str, list[list[float]]] = {"b": [], "c": []}
    block_s: list[list[float]] = []  # each block's seconds on the lone worker (one thread, one block at a time)
    vecs: dict[str, dict[str, np.ndarray]] = {}
    for r in range(args.rounds):
        t0 = time.perf_counter()
        raw, backward_s = [], 0.0
        for it in items:
            g, b = naive_group_gradient(model, params, it.examples, tok.pad_token_id)
            raw.append(g)
            backward_s += b
        times["a"].append(time.perf_counter() - t0)
        if r == 0:
            naive_raw, naive_backward_s = raw, backward_s
        for key, pool in (("b", pool1), ("c", pool2)):
            elapsed, vectors, used, each = time_blocks(pool, blocks)
            times[key].append(elapsed)
            busy[key].append(used)
            if key == "b":
                block_s.append(each)
            vecs.setdefault(key, vectors)
        print(f"round {r + 1}: (a) {times['a'][-1]:.2f} s, (b) {times['b'][-1]:.2f} s, (c) {times['c'][-1]:.2f} s; "
              f"(b)/(a) = {times['a'][-1] / times['b'][-1]:.2f}x, (c)/(b) = {times['b'][-1] / times['c'][-1]:.2f}x",
              flush=True)
    ray_idle = ray_cpu_share(args.ray_idle_s) if args.ray_idle_s > 0 else {}
    ray.shutdown()

    t1 = time.perf_counter()
    naive_vectors = projector.project(np.stack(naive_raw))
    project_groups_s = time.perf_counter() - t1
    per_example = np.random.default_rng(0).standard_normal((sum(len(it.examples) for it in items), d)).astype(np.float32)
    t1 = time.perf_counter()
    projector.project(per_example)
    project_examples_s = time.perf_counter() - t1

    naive = dict(zip([it.name for it in items], naive_vectors))
    one, two = vecs["b"], vecs["c"]
    cos = min_cosine(naive, one)
    same_2 = max(float(np.abs(one[n] - two[n]).max()) for n in one)
    best = {k: min(v) for k, v in times.items()}
    median = {k: float(np.median(v)) for k, v in times.items()}
    fig = {
        "bench": "featurize", "groups": len(items), "examples": sum(len(it.examples) for it in items),
        "tokens": tokens, "max_length": args.max_length, "token_budget": args.token_budget, "rounds": args.rounds,
        "naive_s": round(best["a"], 3), "convalue_1w_s": round(best["b"], 3), "convalue_2w_s": round(best["c"], 3),
        "naive_tok_s": round(tokens / best["a"], 1), "convalue_1w_tok_s": round(tokens / best["b"], 1),
        "convalue_2w_tok_s": round(tokens / best["c"], 1),
        "speedup_1w_vs_naive": round(best["a"] / best["b"], 2), "speedup_2w_vs_1w": round(best["b"] / best["c"], 2),
        "median_speedup_1w_vs_naive": round(median["a"] / median["b"], 2),
        "median_speedup_2w_vs_1w": round(median["b"] / median["c"], 2),
        "rounds_s": {k: [round(t, 3) for t in v] for k, v in times.items()},
        "min_cosine_naive_vs_convalue": round(cos, 6), "max_abs_diff_1w_vs_2w": same_2,
        "worker_startup_s": round(startup_s, 2),
        "busy_s_1w": [round(b, 2) for b in busy["b"][int(np.argmin(times["b"]))]],
        "busy_s_2w": [round(b, 2) for b in busy["c"][int(np.argmin(times["c"]))]],
        "blocks_tokens": [block_tokens(b) for b in blocks],
        "block_s_1w": [round(t, 2) for t in block_s[int(np.argmin(times["b"]))]],
        "projection_share_of_backward_group_means": round(project_groups_s / naive_backward_s, 4),
        "projection_share_of_backward_per_example": round(project_examples_s / naive_backward_s, 4),
        "ray_idle_cpu_share": round(sum(ray_idle.values()), 4),
        "ray_idle_cpu_by_process": {k: round(v, 4) for k, v in ray_idle.items()},
    }
    print(f"{len(items)} groups x {args.m} examples, {tokens} tokens (max_length {args.max_length}); "
          f"best of {args.rounds} interleaved rounds (median ratio in brackets)")
    print(f"(a) naive loop, 1 thread         {best['a']:8.2f} s  {fig['naive_tok_s']:8.1f} tok/s")
    print(f"(b) convalue, 1 worker x 1 thread {best['b']:8.2f} s  {fig['convalue_1w_tok_s']:8.1f} tok/s  "
          f"(b)/(a) = {fig['speedup_1w_vs_naive']}x ({fig['median_speedup_1w_vs_naive']}x)   [target >= 2x]")
    print(f"(c) convalue, 2 workers x 1 thread {best['c']:7.2f} s  {fig['convalue_2w_tok_s']:8.1f} tok/s  "
          f"(c)/(b) = {fig['speedup_2w_vs_1w']}x ({fig['median_speedup_2w_vs_1w']}x)   [target >= 1.8x]")
    print(f"    busy per worker: {fig['busy_s_1w']} s alone, {fig['busy_s_2w']} s as two "
          f"(blocks of {fig['blocks_tokens']} tokens, {fig['block_s_1w']} s each on the lone worker)")
    if ray_idle:
        print(f"    Ray's own processes, every actor idle: {100 * fig['ray_idle_cpu_share']:.1f} % of one core ("
              + ", ".join(f"{k} {100 * v:.1f} %" for k, v in ray_idle.items()) + ")")
    print(f"group vectors (a) vs (b): min cosine {cos:.6f} [target >= 0.999]; (b) vs (c) max |diff| {same_2:.2e}")
    print(f"projection / backward time: {fig['projection_share_of_backward_group_means']:.4f} (group means), "
          f"{fig['projection_share_of_backward_per_example']:.4f} (every example) [target <= 0.10]")
    print(json.dumps(fig))


if __name__ == "__main__":
    main()
