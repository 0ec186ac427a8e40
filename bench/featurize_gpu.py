"""Featurisation on one CUDA GPU (SmolLM2 + chatterbot groups), in one run: the CUDA path checked and timed.

(a) the naive loop on the GPU: fp32 weights, batch size 1, full-vocabulary logits, one backward per
    example, CPU copy, mean (as the paper's reference code does it);
(b) convalue's featuriser on the GPU, fp32 weights (token-budget packing across groups, per-example
    gradients from one backward, LM head on response tokens only);
    and (b) again with the shared prefix recomputed in every batch (what keeping it saves on the device);
(c) the same with model.dtype: bfloat16 (bf16 weights, bf16 autocast; LoRA weights stay fp32);
(d) (b) inside Ray GradientWorker actors that hold the GPU (num_gpus): 1 worker x 1 GPU, then
    2 workers x 0.5 GPU;
(e) task vectors on the GPU (fp32 and bf16 autocast) against the same on the CPU;
(f) full-parameter gradients (CountSketch) on the GPU against the CPU; per-example vectors kept on the GPU;
(g) GRPO on mathematics prompts: G completions per prompt sampled on the GPU, then the surrogate gradient from
    those same completions on the GPU (fp32 and bf16 autocast) against the CPU (sampling itself draws from
    another random stream on each device, so only the gradient given the completions can be compared).
Checks (b), (c), (d) against (a) and (b) against the CPU featuriser by cosine, prints tokens/s and
ratios, and ends with one JSON line. The CPU targets are bench/featurize.py's.

    python bench/featurize_gpu.py [--groups 18 --m 32 --max-length 256 --token-budget 16384]

`--device cpu` runs the same code on the CPU (a dry run of this script, not a GPU figure).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np
from featurize import (  # bench/featurize.py, beside this script; it sets the offline environment on import
    bench_items,
    featurize_on_ray,
    grpo_bench_items,
    grpo_spec,
    min_cosine,
    naive_group_gradient,
    start_ray,
    variant,
    worker_spec,
)


def by_name(items: list, X: np.ndarray) -> dict[str, np.ndarray]:
    """Rows of a featurised block keyed by their group's name."""
    return dict(zip([it.name for it in items], X))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda", help="cuda (the point of this script) or cpu (a dry run)")
    ap.add_argument("--groups", type=int, default=18)
    ap.add_argument("--m", type=int, default=32, help="preview examples per group")
    ap.add_argument("--max-length", type=int, default=256)
    ap.add_argument("--token-budget", type=int, default=16384)
    ap.add_argument("--groups-per-call", type=int, default=6)
    ap.add_argument("--dim", type=int, default=8192)
    ap.add_argument("--cpu-groups", type=int, default=3, help="groups also featurised on the CPU for the cosine")
    ap.add_argument("--grpo-prompts", type=int, default=8, help="(g): prompts per mathematics group (2 groups)")
    ap.add_argument("--grpo-generations", type=int, default=8, help="(g): G, completions sampled per prompt")
    ap.add_argument("--model", default="smollm2-135m-instruct",
                    help="model.source: the built-in SmolLM2-135M or a local Hugging Face folder (the tests pass a tiny one)")
    ap.add_argument("--skip-ray", action="store_true", help="leave out (d), for a machine without Ray installed")
    ap.add_argument("--profile", type=int, default=0, help="print this many rows of a torch.profiler table "
                    "(one block, fp32 and bf16)")
    args = ap.parse_args()

    import torch

    from convalue.engine.config import (
        FeaturesConfig,
        ModelConfig,
    )
    from convalue.engine.data.tokenize import WorkItem
    from convalue.engine.features.batching import plan_blocks
    from convalue.engine.features.projection import make_projector
    from convalue.engine.features.replica import build_featurizer, featurised_parameters
    from convalue.engine.model.loading import load_model, load_tokenizer, resolve_model_dir

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        sys.exit("bench/featurize_gpu.py: no CUDA device here (torch.cuda.is_available() is False); "
                 "use --device cpu for a dry run")
    dev = args.device
    gpu = torch.cuda.get_device_name(0) if dev.startswith("cuda") else "none"
    model_dir = resolve_model_dir(ModelConfig(source=args.model))
    tok = load_tokenizer(model_dir)
    items = bench_items(tok, args.groups, args.m, args.max_length)
    tokens = sum(len(e) for it in items for e in it.examples)
    spec = worker_spec(model_dir, tok.pad_token_id, args.token_budget, dim=args.dim, device=dev,
                       max_length=args.max_length)
    lora, proj = spec.lora, spec.projection
    blocks = plan_blocks(items, args.groups_per_call)

    def sync() -> None:
        if dev.startswith("cuda"):
            torch.cuda.synchronize()

    def in_process(s, subset=None, profile: str | None = None,
                   prefix_cache_size: int | None = None) -> tuple[float, float, dict[str, np.ndarray], float]:
        """(cold seconds, warm seconds, vectors, peak GPU GiB) of the worker's featuriser run in this process.

        cold: the first pass over the blocks (new batch shapes, measured slower: bf16 ran at a fifth of its warm
        rate at token_budget 16384); warm: a second pass over the same blocks, the steady state of a long run.
        prefix_cache_size 0: the shared prefix recomputed in every batch (the featuriser before it was kept).
        """
        f = build_featurizer(s)
        if prefix_cache_size is not None:
            f.prefix_cache_size = prefix_cache_size
        f.featurize(blocks[0][:1])  # warm-up (CUDA context, allocator)
        todo = plan_blocks(subset, args.groups_per_call) if subset else blocks
        if dev.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()
        times, out = [], {}
        for _ in range(1 if subset else 2):
            sync()
            t0 = time.perf_counter()
            for b in todo:
                out.update(by_name(b, f.featurize(b)))
            sync()
            times.append(time.perf_counter() - t0)
        if profile and args.profile:
            from torch.profiler import ProfilerActivity
            from torch.profiler import profile as torch_profile

            acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.startswith("cuda") else [])
            with torch_profile(activities=acts) as prof:
                f.featurize(todo[0])
                sync()
            for key in ["self_cuda_time_total"] * dev.startswith("cuda") + ["self_cpu_time_total"]:
                print(f"--- profile, {profile}: one block of {len(todo[0])} groups, by {key}")
                print(prof.key_averages().table(sort_by=key, row_limit=args.profile))
        peak = torch.cuda.max_memory_allocated() / 2**30 if dev.startswith("cuda") else 0.0
        return times[0], times[-1], out, peak

    # (a) naive loop on the device
    model, named = featurised_parameters(load_model(model_dir, "float32", dev), FeaturesConfig(), lora)
    params = [p for _, p in named]
    projector = make_projector(proj.kind, sum(p.numel() for p in params), proj.dim, proj.seed)
    naive_group_gradient(model, params, items[0].examples[:1], tok.pad_token_id, dev)  # warm-up
    sync()
    t0 = time.perf_counter()
    raw = [naive_group_gradient(model, params, it.examples, tok.pad_token_id, dev)[0] for it in items]
    naive_s = time.perf_counter() - t0
    naive = by_name(items, projector.project(np.stack(raw)))
    del model, named, params
    if dev.startswith("cuda"):
        torch.cuda.empty_cache()

    # (b), (c) the worker's featuriser in this process
    fp32_cold, fp32_s, fp32, fp32_peak = in_process(spec, profile="fp32")
    bf16_cold, bf16_s, bf16, bf16_peak = in_process(variant(spec, dtype="bfloat16"), profile="bf16")
    # (b) with the shared prefix recomputed in every batch: what keeping it saves on this device
    _, recomputed_s, recomputed, _ = in_process(spec, prefix_cache_size=0)
    # (b) on the CPU, a few groups: the same featuriser gives the same vectors on either device
    torch.set_num_threads(min(8, os.cpu_count() or 1))
    *_, on_cpu, _ = in_process(variant(spec, device="cpu"), subset=items[: args.cpu_groups])
    # per-example vectors kept on the device: their mean is the group vector
    f = build_featurizer(variant(spec, keep_per_example=True))
    X = f.featurize(blocks[0])
    per_example_err = max(float(np.abs(f.per_example[it.name].mean(0) - x).max() / np.abs(x).max())
                          for it, x in zip(blocks[0], X))
    del f

    # (d) Ray actors holding the GPU: free this process's cached blocks first (fractional GPUs share its memory)
    import gc

    gc.collect()
    if dev.startswith("cuda"):
        torch.cuda.empty_cache()
    if args.skip_ray:
        gpus_total = gpu_each = ray1_s = ray2_s = ray1 = ray2 = None
    else:
        import ray

        start_ray(4)
        gpus_total = ray.cluster_resources().get("GPU", 0.0)
        gpu_each = 1.0 if gpus_total >= 1 else 0.0
        ray1_s, _, ray1, _ = featurize_on_ray(spec, blocks, 1, gpu_each)
        ray2_s, _, ray2, _ = featurize_on_ray(spec, blocks, 2, gpu_each / 2)
        ray.shutdown()

    # (e) task vectors: the GPU against the CPU, on two groups
    tv = variant(spec, representation="task_vector", tv_steps=3)
    tv_items = items[:2]
    f = build_featurizer(tv)
    t0 = time.perf_counter()
    tv_dev = by_name(tv_items, f.featurize(tv_items))
    tv_s = time.perf_counter() - t0
    del f
    tv_bf16 = by_name(tv_items, build_featurizer(variant(tv, dtype="bfloat16")).featurize(tv_items))
    tv_cpu = by_name(tv_items, build_featurizer(variant(tv, device="cpu")).featurize(tv_items))

    # (f) full-parameter gradients (every weight, CountSketch): the device against the CPU, on one group of 8
    full = variant(spec, parameters="full")
    one = [WorkItem(items[0].name, items[0].examples[:8])]
    f = build_featurizer(full)
    f.featurize(one)
    if dev.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    sync()
    t0 = time.perf_counter()
    full_dev = by_name(one, f.featurize(one))
    full_s = time.perf_counter() - t0
    full_peak = torch.cuda.max_memory_allocated() / 2**30 if dev.startswith("cuda") else 0.0
    del f
    full_cpu = by_name(one, build_featurizer(variant(full, device="cpu")).featurize(one))

    # (g) GRPO: completions sampled once on the device, then the surrogate gradient from them on each side
    math = grpo_bench_items(tok, args.grpo_prompts, args.max_length)
    grpo = grpo_spec(spec, args.grpo_generations)

    def timed_sampling(g) -> tuple[float, list]:
        """(seconds, completions) of one featuriser sampling every group, after a one-prompt warm-up (generate's
        first call is far slower)."""
        g.sample(math[0].name, math[0].examples[:1])
        sync()
        t0 = time.perf_counter()
        completions = [g.sample(it.name, it.examples) for it in math]
        sync()
        return time.perf_counter() - t0, completions

    def timed_gradients(g, completions: list) -> tuple[float, dict[str, np.ndarray]]:
        """(seconds, raw surrogate gradients by group) of one featuriser on the given completions."""
        sync()
        t0 = time.perf_counter()
        grads = {it.name: g.surrogate_gradient(it, c) for it, c in zip(math, completions)}
        sync()
        return time.perf_counter() - t0, grads

    g = build_featurizer(grpo)
    grpo_sample_s, completions = timed_sampling(g)
    grpo_grad_s, grpo_dev = timed_gradients(g, completions)
    g = build_featurizer(variant(grpo, dtype="bfloat16"))
    grpo_bf16_sample_s, _ = timed_sampling(g)  # its own completions: only the time is compared
    grpo_grad_bf16_s, grpo_bf16 = timed_gradients(g, completions)
    _, grpo_cpu = timed_gradients(build_featurizer(variant(grpo, device="cpu")), completions)
    del g
    n_completions = sum(len(c) for cs in completions for c in cs)

    fig = {
        "bench": "featurize_gpu", "device": dev, "gpu": gpu, "groups": len(items),
        "examples": sum(len(it.examples) for it in items), "tokens": tokens, "max_length": args.max_length,
        "token_budget": args.token_budget,
        "naive_tok_s": round(tokens / naive_s, 1), "fp32_tok_s": round(tokens / fp32_s, 1),
        "bf16_tok_s": round(tokens / bf16_s, 1), "fp32_prefix_recomputed_tok_s": round(tokens / recomputed_s, 1),
        "speedup_prefix_kept": round(recomputed_s / fp32_s, 3),
        "max_abs_prefix_kept_vs_recomputed": float(max(np.abs(recomputed[n] - fp32[n]).max() for n in fp32)),
        "fp32_cold_tok_s": round(tokens / fp32_cold, 1),
        "bf16_cold_tok_s": round(tokens / bf16_cold, 1),
        "speedup_fp32_vs_naive": round(naive_s / fp32_s, 2), "speedup_bf16_vs_fp32": round(fp32_s / bf16_s, 2),
        "cos_fp32_vs_naive": round(min_cosine(naive, fp32), 6), "cos_bf16_vs_naive": round(min_cosine(naive, bf16), 6),
        "cos_fp32_gpu_vs_cpu": round(min_cosine(fp32, on_cpu), 6),
        "cos_task_vector_gpu_vs_cpu": round(min_cosine(tv_dev, tv_cpu), 6), "task_vector_s_per_group": round(tv_s / 2, 3),
        "cos_task_vector_bf16_vs_cpu": round(min_cosine(tv_bf16, tv_cpu), 6),
        "grpo_groups": len(math), "grpo_completions": n_completions,
        "grpo_sample_s": round(grpo_sample_s, 3), "grpo_sample_bf16_s": round(grpo_bf16_sample_s, 3),
        "grpo_grad_s": round(grpo_grad_s, 3), "grpo_grad_bf16_s": round(grpo_grad_bf16_s, 3),
        "cos_grpo_gpu_vs_cpu": round(min_cosine(grpo_dev, grpo_cpu), 6),
        "cos_grpo_bf16_vs_cpu": round(min_cosine(grpo_bf16, grpo_cpu), 6),
        "per_example_mean_rel_err": per_example_err,
        "cos_full_gpu_vs_cpu": round(min_cosine(full_dev, full_cpu), 6), "full_s_per_group_of_8": round(full_s, 3),
        "peak_gib_full": round(full_peak, 2),
        "peak_gib_fp32": round(fp32_peak, 2), "peak_gib_bf16": round(bf16_peak, 2), "ray_gpus": gpus_total,
    }
    if ray1 is not None:
        fig |= {"ray_1w_tok_s": round(tokens / ray1_s, 1), "ray_2w_tok_s": round(tokens / ray2_s, 1),
                "speedup_ray_2w_vs_1w": round(ray1_s / ray2_s, 2),
                "max_abs_ray_1w_vs_in_process": float(max(np.abs(ray1[n] - fp32[n]).max() for n in fp32)),
                "cos_ray_2w_vs_naive": round(min_cosine(naive, ray2), 6)}
    print(f"{gpu}: {len(items)} groups x {args.m} examples, {tokens} tokens (max_length {args.max_length})")
    print(f"(a) naive loop, fp32           {naive_s:8.2f} s {fig['naive_tok_s']:10.1f} tok/s")
    print(f"(b), (c) below: a warm second pass over the same blocks; the first pass ran at "
          f"{fig['fp32_cold_tok_s']} (fp32) and {fig['bf16_cold_tok_s']} (bf16) tok/s")
    print(f"(b) convalue, fp32             {fp32_s:8.2f} s {fig['fp32_tok_s']:10.1f} tok/s  (b)/(a) = "
          f"{fig['speedup_fp32_vs_naive']}x  cos vs (a) {fig['cos_fp32_vs_naive']}  vs CPU {fig['cos_fp32_gpu_vs_cpu']}")
    print(f"    prefix recomputed, fp32    {recomputed_s:8.2f} s {fig['fp32_prefix_recomputed_tok_s']:10.1f} tok/s  "
          f"kept/recomputed = {fig['speedup_prefix_kept']}x  max |diff| {fig['max_abs_prefix_kept_vs_recomputed']:.2e}")
    print(f"(c) convalue, bf16             {bf16_s:8.2f} s {fig['bf16_tok_s']:10.1f} tok/s  (c)/(b) = "
          f"{fig['speedup_bf16_vs_fp32']}x  cos vs (a) {fig['cos_bf16_vs_naive']}")
    if ray1 is None:
        print("(d) Ray: left out (--skip-ray)")
    else:
        print(f"(d) Ray, 1 worker x {gpu_each} GPU   {ray1_s:8.2f} s {fig['ray_1w_tok_s']:10.1f} tok/s  "
              f"max |diff| vs (b) {fig['max_abs_ray_1w_vs_in_process']:.2e}")
        print(f"    Ray, 2 workers x {gpu_each / 2} GPU {ray2_s:7.2f} s {fig['ray_2w_tok_s']:10.1f} tok/s  "
              f"x{fig['speedup_ray_2w_vs_1w']} vs 1 worker, cos vs (a) {fig['cos_ray_2w_vs_naive']}")
    print(f"(e) task vectors: {fig['task_vector_s_per_group']} s/group, cos GPU vs CPU {fig['cos_task_vector_gpu_vs_cpu']}, "
          f"bf16 vs CPU {fig['cos_task_vector_bf16_vs_cpu']}")
    print(f"    per-example vectors kept: their mean matches the group vector to {per_example_err:.1e} (relative)")
    print(f"(f) full-parameter, 1 group of 8: {full_s:.3f} s, cos GPU vs CPU {fig['cos_full_gpu_vs_cpu']}, "
          f"peak {fig['peak_gib_full']} GiB")
    print(f"(g) GRPO, {len(math)} groups x {args.grpo_prompts} prompts, {n_completions} completions: sampling {grpo_sample_s:.2f} s "
          f"(bf16 {grpo_bf16_sample_s:.2f} s), gradients {grpo_grad_s:.2f} s (bf16 {grpo_grad_bf16_s:.2f} s); "
          f"on the same completions cos GPU vs CPU {fig['cos_grpo_gpu_vs_cpu']}, bf16 vs CPU {fig['cos_grpo_bf16_vs_cpu']}")
    print(json.dumps(fig))


if __name__ == "__main__":
    main()
