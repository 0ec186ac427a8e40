"""The kept shared prefix against one recomputed in every batch, in one process on 1 thread.

The bench/featurize.py data (SmolLM2-135M, chatterbot groups, 2,048-token batches). The featuriser runs with
its shared prefix (the chat template's system prompt and user header) kept between batches and calls, and
with it recomputed in every batch (prefix_cache_size = 0, the behaviour before it was kept), in interleaved
passes; a kept pass starts from an empty cache, so each pays its own prefix forwards. Prints the median time
of each, their ratio, the vectors' largest difference, the FLOPs of both and of the naive loop, and the
memory the kept prefixes' graphs hold; ends with one JSON line.

    .venv/bin/python bench/prefix_cache.py [--passes 4]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path[0] = str(Path(__file__).resolve().parents[1])  # bench.featurize sets the offline environment on import

from bench.featurize import (  # noqa: E402
    add_data_args,
    interleaved_passes,
    naive_flops,
    one_featurizer,
    variant_flops,
)


def kept_bytes(f, blocks: list) -> dict[int, int]:
    """Bytes of the tensors each kept prefix's graph saves (parameters excluded), by its number of rows, after
    one pass over `blocks` from an empty cache."""
    import torch

    import convalue.engine.features.gradients as fz

    params = {p.untyped_storage().data_ptr() for p in f.model.parameters()}
    sizes: dict[int, int] = {}
    real = fz.prefix_forward

    def counted(model, ids, rows, device):
        seen: dict[int, int] = {}

        def pack(t):
            ptr = t.untyped_storage().data_ptr()
            if ptr not in params:
                seen[ptr] = t.untyped_storage().nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            kv = real(model, ids, rows, device)
        sizes[rows] = sum(seen.values())
        return kv

    f._prefixes.clear()
    fz.prefix_forward = counted
    try:
        for b in blocks:
            f.featurize(b)
    finally:
        fz.prefix_forward = real
    return {rows: sizes[rows] for rows in sorted(sizes)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_data_args(ap)
    args = ap.parse_args()

    from convalue.engine.features.gradients import PREFIX_CACHE_SIZE

    model_dir, tok, items, blocks, f = one_featurizer(args)

    def switch(size: int):
        def to() -> None:
            f.prefix_cache_size = size
            f._prefixes.clear()
        return to

    variants = {"recomputed": switch(0), "kept": switch(PREFIX_CACHE_SIZE)}
    times, vectors = interleaved_passes(f, blocks, variants, args.passes)
    flops = variant_flops(f, blocks, variants)
    flops["naive"] = naive_flops(model_dir, items, tok.pad_token_id)
    f.prefix_cache_size = PREFIX_CACHE_SIZE
    kept = kept_bytes(f, blocks)

    med = {v: statistics.median(t) for v, t in times.items()}
    diff = max(float(np.abs(vectors["kept"][n] - vectors["recomputed"][n]).max()) for n in vectors["kept"])
    fig = {"bench": "prefix_cache", "groups": len(items), "tokens": sum(len(e) for it in items for e in it.examples),
           "passes": args.passes, "median_s": {v: round(t, 3) for v, t in med.items()},
           "all_s": {v: [round(x, 3) for x in t] for v, t in times.items()},
           "speedup": round(med["recomputed"] / med["kept"], 3),
           "gflop": {v: round(x / 1e9, 4) for v, x in flops.items()},
           "flop_ratio_naive_to_kept": round(flops["naive"] / flops["kept"], 3),
           "max_abs_diff": diff, "kept_graph_mb_by_rows": {r: round(b / 2**20, 1) for r, b in kept.items()}}
    print(f"{fig['groups']} groups, {fig['tokens']} tokens, {args.passes} interleaved passes each (1 thread)")
    for v in variants:
        print(f"  {v:10s} median {med[v]:7.2f} s  {flops[v] / 1e9:8.1f} GFLOP  passes {fig['all_s'][v]}")
    print(f"  naive loop                {flops['naive'] / 1e9:8.1f} GFLOP")
    print(f"kept prefix vs recomputed in every batch: {fig['speedup']}x faster (median), vectors differ by at most "
          f"{diff:.2e}")
    print("kept prefix graphs, MiB by owners per batch: "
          + ", ".join(f"{r}: {mb}" for r, mb in fig["kept_graph_mb_by_rows"].items()))
    print(json.dumps(fig))


if __name__ == "__main__":
    main()
