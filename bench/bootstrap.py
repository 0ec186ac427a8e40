"""The bootstrap over the previews on one solver actor (the baseline) against ray.workers actors, in one run.

Per-example vectors: N groups of m examples, each example its group's clustered synthetic gradient
(bench/synthetic.py) plus noise, float32 as the vector store keeps them; the target's m examples around
the mean of three groups' gradients.
Each resample re-forms G, g_tar, K = G G^T and beta and solves KMM (penalised, cosine-normalised, as the demo
config). Both widths run through convalue.actors.solver.bootstrap_on_actors in one local Ray (started before the clock;
actor start-up and the object-store put are inside it), --repeats times alternately; prints the medians, the
ratio and whether both widths gave the same resamples, and ends with one JSON line.

    .venv/bin/python bench/bootstrap.py [--case 1000x4096] [--m 8] [--samples 32] [--workers 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
from synthetic import case, clustered_gradients  # bench/synthetic.py, beside this script

from convalue.engine.data.prepare import TARGET_KEY


def per_example_vectors(n: int, p: int, m: int, seed: int = 0) -> tuple[dict[str, np.ndarray], list[str]]:
    """({name: m x p float32} for n groups and the target, names): examples scattered around clustered gradients;
    the target's around the mean of three groups' gradients (so some clusters help it)."""
    G, _ = clustered_gradients(n, p, seed=seed)
    rng = np.random.default_rng(seed + 1)
    g_tar = G[rng.choice(n, size=3, replace=False)].mean(axis=0)
    g_tar /= np.linalg.norm(g_tar)
    names = [f"g{i:05d}" for i in range(n)]
    examples = {name: (G[i] + 0.5 * rng.standard_normal((m, p)).astype(np.float32) / np.sqrt(p))
                for i, name in enumerate(names)}
    examples[TARGET_KEY] = g_tar + 0.5 * rng.standard_normal((m, p)).astype(np.float32) / np.sqrt(p)
    return examples, names


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", type=case, default=(1000, 4096), help="N x p (default 1000x4096)")
    ap.add_argument("--m", type=int, default=8, help="preview examples per group (default 8)")
    ap.add_argument("--samples", type=int, default=32, help="bootstrap resamples B (default 32)")
    ap.add_argument("--workers", type=int, default=2, help="solver actors of the spread run (default 2)")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    import ray

    from convalue.actors.solver import bootstrap_on_actors
    from convalue.engine.selection.solve import SolveSpec

    (n, p), B = args.case, args.samples
    examples, names = per_example_vectors(n, p, args.m)
    spec, k = SolveSpec(gamma=5e-2, normalize="cosine", rank_bound=p), 5  # the demo's solve, in Gram space
    ray.init(address="local", num_cpus=max(args.workers, 1), include_dashboard=False, log_to_driver=False, configure_logging=False)
    times: dict[int, list[float]] = {1: [], args.workers: []}
    results = {}
    for _ in range(args.repeats):
        for width in times:
            t0 = time.perf_counter()
            results[width] = bootstrap_on_actors(examples, names, spec, k, B, seed=0, workers=width)
            times[width].append(time.perf_counter() - t0)
    ray.shutdown()
    one, spread = statistics.median(times[1]), statistics.median(times[args.workers])
    (W1, S1), (W2, S2) = results[1], results[args.workers]
    same = bool(np.allclose(W1, W2, rtol=1e-9, atol=1e-12) and np.array_equal(S1, S2))
    print(f"N={n} p={p} m={args.m} B={B}: one actor {one:.2f} s, {args.workers} actors {spread:.2f} s "
          f"({one / spread:.2f}x); same resamples: {same}; selected per resample {S1.sum(1).mean():.1f}")
    print(json.dumps({"bench": "bootstrap", "n": n, "p": p, "m": args.m, "samples": B, "workers": args.workers,
                      "one_actor_s": round(one, 3), "spread_s": round(spread, 3), "ratio": round(one / spread, 3),
                      "same_resamples": same, "times": {str(k): [round(t, 3) for t in v] for k, v in times.items()}}))


if __name__ == "__main__":
    main()
