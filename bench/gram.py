"""The blocked Gram on Ray against one G @ G.T in the same process.

Clustered synthetic unit-norm gradients (bench/synthetic.py), cut into blocks of `--block-rows` rows as gradient
workers would return them and put into Ray's object store (not timed: in a run they are there already). Times,
interleaved over `--rounds`, (a) one `G @ G.T` of the float64 vectors in this process (BLAS on every core) and (b)
convalue's build: tile tasks K_ij = X_i X_j^T over panels, assembled by the driver (actors/gram.py). Checks that
both K agree to round-off, prints the ratio and ends with one JSON line. Above SYRK_MAX_N rows the baseline is
convalue.solvers.linalg.self_gram (the same product in 4096-row panels, in this process): numpy's single G @ G.T
segfaults there in OpenBLAS's threaded syrk on the development machine (numpy#19685).

    .venv/bin/python bench/gram.py                       # N = 10000 and 30000, p = 4096
    .venv/bin/python bench/gram.py --n 2000 --p 256      # quick
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
import ray
from synthetic import clustered_gradients

from convalue.actors.gram import build_gram
from convalue.engine.selection.blocked import BlockRows
from convalue.solvers.linalg import self_gram

SYRK_MAX_N = 14_000  # the largest N at which G @ G.T was seen to run here with two BLAS threads


def case(n: int, p: int, block_rows: int, rounds: int) -> dict:
    """Baseline and blocked build for one size; the best round of each."""
    G, g = clustered_gradients(n, p, seed=0)
    G = np.ascontiguousarray(G, dtype=np.float32)
    refs, blocks = {}, []
    for b, start in enumerate(range(0, n, block_rows)):
        rows = G[start:start + block_rows]
        file = f"block-{b:06d}"
        refs[file] = ray.put(rows)
        blocks.append(BlockRows(file, tuple(range(len(rows))), tuple(range(start, start + len(rows))), None,
                                rows.nbytes))
    base_s, tile_s, err = [], [], 0.0
    for _ in range(rounds):
        t0 = time.perf_counter()
        G64 = G.astype(np.float64)
        K0 = G64 @ G64.T if n <= SYRK_MAX_N else self_gram(G64)
        base_s.append(time.perf_counter() - t0)
        diag0 = K0[np.arange(0, n, max(1, n // 97))].copy()
        del K0, G64
        t0 = time.perf_counter()
        result = build_gram(blocks, refs, n, g, "euclidean")
        tile_s.append(time.perf_counter() - t0)
        rows = np.arange(0, n, max(1, n // 97))
        err = max(err, float(np.abs(result.K[rows] - diag0).max() / np.abs(diag0).max()))
        del result
    out = {"n": n, "p": p, "block_rows": block_rows, "baseline": "G @ G.T" if n <= SYRK_MAX_N else "self_gram",
           "baseline_s": round(min(base_s), 3),
           "blocked_s": round(min(tile_s), 3), "speed_vs_product": round(min(base_s) / min(tile_s), 3),
           "max_rel_diff": err}
    print(f"N = {n:>6}, p = {p}: {out['baseline']} {out['baseline_s']:.2f} s, blocked Gram {out['blocked_s']:.2f} s "
          f"-> {out['speed_vs_product']:.2f}x the product's speed (max relative difference {err:.1e})", flush=True)
    return out


def main() -> None:
    """Run the cases and print one JSON line."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, nargs="+", default=[10_000, 30_000])
    ap.add_argument("--p", type=int, default=4096)
    ap.add_argument("--block-rows", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    biggest = max(args.n) * args.p * 4
    ray.init(address="local", num_cpus=os.cpu_count() or 1, include_dashboard=False, log_to_driver=False,
             object_store_memory=max(2 * biggest + (1 << 30), 1 << 30))
    results = [case(n, args.p, args.block_rows, args.rounds) for n in args.n]
    ray.shutdown()
    print(json.dumps({"bench": "gram", "cores": os.cpu_count(), "results": results}))


if __name__ == "__main__":
    main()
