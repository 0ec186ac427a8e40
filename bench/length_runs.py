"""Length runs (model.split_cost_tokens) against one padded forward per batch, in one process on 1 thread.

The bench/featurize.py data (SmolLM2-135M, chatterbot groups, 2,048-token batches). The featuriser runs
with and without cuts in interleaved passes (the machine's drift hits both alike); prints the median
time of each, their ratio, the vectors' agreement, and the FLOPs of the naive loop and of both variants
(torch.utils.flop_counter); ends with one JSON line.

    .venv/bin/python bench/length_runs.py [--passes 4 --split-cost-tokens 32]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path[0] = str(Path(__file__).resolve().parents[1])
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from bench.featurize import bench_items, min_cosine, naive_group_gradient, worker_spec  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--groups", type=int, default=16)
    ap.add_argument("--m", type=int, default=4)
    ap.add_argument("--max-length", type=int, default=64)
    ap.add_argument("--token-budget", type=int, default=2048)
    ap.add_argument("--groups-per-call", type=int, default=4)
    ap.add_argument("--split-cost-tokens", type=int, default=32)
    ap.add_argument("--passes", type=int, default=4)
    args = ap.parse_args()

    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from engine.config import FeaturesConfig, LoraConfig, ModelConfig
    from engine.featurize import plan_blocks
    from engine.models import load_model, load_tokenizer, resolve_model_dir
    from engine.replica import build_featurizer, featurised_parameters

    torch.set_num_threads(1)
    model_dir = resolve_model_dir(ModelConfig())
    tok = load_tokenizer(model_dir)
    items = bench_items(tok, args.groups, args.m, args.max_length)
    blocks = plan_blocks(items, args.groups_per_call)
    spec = worker_spec(model_dir, tok.pad_token_id, args.token_budget)
    f = build_featurizer(spec)
    f.featurize(blocks[0][:1])  # warm-up
    variants = {"one_forward": None, "length_runs": args.split_cost_tokens}

    def run_all() -> dict[str, np.ndarray]:
        return {name: x for b in blocks for name, x in zip([it.name for it in b], f.featurize(b))}

    times: dict[str, list[float]] = {v: [] for v in variants}
    vectors: dict[str, dict[str, np.ndarray]] = {}
    for _ in range(args.passes):
        for v, cost in variants.items():
            f.split_cost_tokens = cost
            t0 = time.perf_counter()
            vectors[v] = run_all()
            times[v].append(time.perf_counter() - t0)
    flops = {}
    for v, cost in variants.items():
        f.split_cost_tokens = cost
        with FlopCounterMode(display=False) as counter:
            run_all()
        flops[v] = counter.get_total_flops()
    model, named = featurised_parameters(load_model(model_dir), FeaturesConfig(), LoraConfig())
    with FlopCounterMode(display=False) as counter:
        for it in items:
            naive_group_gradient(model, [p for _, p in named], it.examples, tok.pad_token_id)
    flops["naive"] = counter.get_total_flops()

    med = {v: statistics.median(t) for v, t in times.items()}
    fig = {"bench": "length_runs", "groups": len(items), "tokens": sum(len(e) for it in items for e in it.examples),
           "split_cost_tokens": args.split_cost_tokens, "passes": args.passes,
           "median_s": {v: round(t, 3) for v, t in med.items()},
           "all_s": {v: [round(x, 3) for x in t] for v, t in times.items()},
           "speedup": round(med["one_forward"] / med["length_runs"], 3),
           "gflop": {v: round(x / 1e9, 1) for v, x in flops.items()},
           "flop_ratio_naive_to_one_forward": round(flops["naive"] / flops["one_forward"], 3),
           "flop_ratio_naive_to_length_runs": round(flops["naive"] / flops["length_runs"], 3),
           "min_cosine": round(min_cosine(vectors["one_forward"], vectors["length_runs"]), 7)}
    print(f"{fig['groups']} groups, {fig['tokens']} tokens, {args.passes} interleaved passes each (1 thread)")
    for v in variants:
        print(f"  {v:12s} median {med[v]:7.2f} s  {flops[v] / 1e9:8.1f} GFLOP  passes {fig['all_s'][v]}")
    print(f"  naive loop                  {flops['naive'] / 1e9:8.1f} GFLOP")
    print(f"length runs vs one forward per batch: {fig['speedup']}x faster (median), "
          f"min cosine {fig['min_cosine']}")
    print(json.dumps(fig))


if __name__ == "__main__":
    main()
