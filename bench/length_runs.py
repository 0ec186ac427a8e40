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
import statistics
import sys
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parents[1])  # bench.featurize sets the offline environment on import

from bench.featurize import (  # noqa: E402
    add_data_args,
    interleaved_passes,
    min_cosine,
    naive_flops,
    one_featurizer,
    variant_flops,
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_data_args(ap)
    ap.add_argument("--split-cost-tokens", type=int, default=32)
    args = ap.parse_args()

    model_dir, tok, items, blocks, f = one_featurizer(args)
    costs = {"one_forward": None, "length_runs": args.split_cost_tokens}
    variants = {v: (lambda c=c: setattr(f, "split_cost_tokens", c)) for v, c in costs.items()}
    times, vectors = interleaved_passes(f, blocks, variants, args.passes)
    flops = variant_flops(f, blocks, variants)
    flops["naive"] = naive_flops(model_dir, items, tok.pad_token_id)

    med = {v: statistics.median(t) for v, t in times.items()}
    fig = {"bench": "length_runs", "groups": len(items), "tokens": sum(len(e) for it in items for e in it.examples),
           "split_cost_tokens": args.split_cost_tokens, "passes": args.passes,
           "median_s": {v: round(t, 3) for v, t in med.items()},
           "all_s": {v: [round(x, 3) for x in t] for v, t in times.items()},
           "speedup": round(med["one_forward"] / med["length_runs"], 3),
           "gflop": {v: round(x / 1e9, 4) for v, x in flops.items()},
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
