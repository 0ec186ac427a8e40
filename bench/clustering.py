"""A flat pool's embedding and k-means: the driver process against Ray workers, in one run.

The pool: real chatterbot pairs (all 28 languages, or --languages), embedded with all-MiniLM-L6-v2 as
`clusters` does it. (a) the driver process alone with --threads torch threads (what a run without Ray would
do); (b) embed_on_workers on a local Ray with --workers actors of one thread each (what `convalue run` does).
Checks that both give the same embeddings (max |diff|), then times scikit-learn's k-means for --clusters.
Prints texts/s of each and the ratio (b)/(a); ends with one JSON line.

    .venv/bin/python bench/clustering.py [--examples 4000] [--workers 2] [--clusters 500]
"""

from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=4000, help="pool size (the first N pairs, languages in order)")
    ap.add_argument("--languages", nargs="*", default=None, help="chatterbot languages (default: all 28)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch threads of the driver (a)")
    ap.add_argument("--workers", type=int, default=2, help="Embedder actors of one thread each (b)")
    ap.add_argument("--clusters", type=int, default=500, help="k of the k-means timed after the embedding")
    args = ap.parse_args()

    import numpy as np
    import ray
    import torch

    from convalue.actors.embedder import embed_on_workers
    from convalue.engine.config import SourceConfig
    from convalue.engine.data.clustering import (
        embed_texts,
        embedding_dir,
        example_text,
        kmeans_labels,
    )
    from convalue.engine.data.sources import load_source

    groups = load_source(SourceConfig(kind="chatterbot", group_by="language", include=args.languages))
    texts = [example_text(ex) for g in groups.values() for ex in g.examples][: args.examples]
    d = embedding_dir("minilm")
    torch.set_num_threads(args.threads)
    embed_texts(texts[:64], d)  # warm-up: first load of the weights and the tokenizer
    t0 = time.perf_counter()
    X_driver = embed_texts(texts, d)
    t_driver = time.perf_counter() - t0

    ray.init(address="local", num_cpus=max(args.workers, os.cpu_count() or 1), include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    try:
        embed_on_workers(texts[:64], d, workers=args.workers, cpus_per_worker=1, max_in_flight=2)  # warm-up
        t0 = time.perf_counter()
        X_ray = embed_on_workers(texts, d, workers=args.workers, cpus_per_worker=1, max_in_flight=2)
        t_ray = time.perf_counter() - t0
    finally:
        ray.shutdown()
    diff = float(np.abs(X_ray - X_driver).max())
    k = min(args.clusters, len(texts))
    t0 = time.perf_counter()
    labels = kmeans_labels(X_ray, k, seed=0)
    t_kmeans = time.perf_counter() - t0

    n = len(texts)
    print(f"pool: {n} chatterbot pairs, MiniLM ({X_ray.shape[1]} dims)")
    print(f"(a) driver, {args.threads} threads:           {t_driver:7.1f} s  {n / t_driver:7.1f} texts/s")
    print(f"(b) Ray, {args.workers} workers x 1 thread (incl. load): {t_ray:7.1f} s  {n / t_ray:7.1f} texts/s")
    print(f"(b)/(a) = {t_driver / t_ray:.2f}x; max |diff| = {diff:.1e}")
    print(f"k-means, k = {k}: {t_kmeans:.1f} s ({int(labels.max()) + 1} clusters)")
    print(json.dumps({"bench": "clustering", "examples": n, "threads": args.threads, "workers": args.workers,
                      "driver_s": round(t_driver, 3), "ray_s": round(t_ray, 3),
                      "ratio": round(t_driver / t_ray, 3), "max_abs_diff": diff, "clusters": k,
                      "kmeans_s": round(t_kmeans, 3)}))


if __name__ == "__main__":
    main()
