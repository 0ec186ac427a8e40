"""Embedder: a Ray actor holding one sentence encoder; a flat pool's texts are embedded across a pool of them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import ray

from convalue.actors.pool import ActorPool, DeferredStartup
from convalue.engine.data.clustering import encode, load_encoder
from convalue.engine.data.examples import DataError


class EmbedderImpl(DeferredStartup):
    """Loads the encoder once, with `threads` torch threads; embeds lists of texts."""

    def __init__(self, model_dir: str, threads: int):
        # torch: only on a worker that runs the model; the driver imports this module without it
        import torch

        torch.set_num_threads(threads)
        self.encoder = self._start(lambda: load_encoder(Path(model_dir)), (DataError,))

    def embed(self, texts: list[str]) -> np.ndarray:
        """Unit-norm embeddings of texts, one float32 row each."""
        self._ready()
        return encode(self.encoder, texts)


# embedding is a pure function of (encoder, texts): retrying a call is safe
Embedder = ray.remote(max_restarts=2, max_task_retries=2)(EmbedderImpl)


@dataclass(frozen=True, eq=False)
class Chunk:
    """The positions of the texts one call embeds (named so in a failed call's error)."""

    index: np.ndarray

    def __repr__(self) -> str:
        return f"embedding of {len(self.index)} pool texts"


def embed_on_workers(texts: list[str], model_dir: Path, *, workers: int, cpus_per_worker: int,
                     max_in_flight: int, chunk: int = 512, progress: object | None = None) -> np.ndarray:
    """Embeddings of texts computed by up to `workers` Embedder actors (chunks of similar length, ray.wait);
    progress: the run's Progress, told each chunk (stage `embed`)."""
    order = np.argsort([len(t) for t in texts], kind="stable")
    chunks = [Chunk(order[i : i + chunk]) for i in range(0, len(texts), chunk)][::-1]  # longest first: short tail
    out: np.ndarray | None = None
    if progress is not None:
        progress.total("embed", len(chunks))
    with ActorPool(Embedder, min(workers, len(chunks)), str(model_dir), cpus_per_worker,
                   options={"num_cpus": cpus_per_worker}) as pool:
        for c, X in pool.map(chunks, lambda a, c: a.embed.remote([texts[i] for i in c.index]), max_in_flight):
            if out is None:
                out = np.empty((len(texts), X.shape[1]), np.float32)
            out[c.index] = X
            if progress is not None:
                progress.advance("embed")
    return out if out is not None else np.empty((0, 0), np.float32)
