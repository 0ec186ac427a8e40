"""Projected vectors as checksummed Parquet blocks in a run folder (local or on any pyarrow filesystem): written by
whoever computed them (a gradient worker, or the driver), each with a small sidecar that commits it, and indexed
by a manifest the driver consolidates now and then, so resume is exact and writing stays linear in the blocks."""

from __future__ import annotations

import hashlib
import json
import logging
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from convalue.engine.files.errors import StoreError
from convalue.engine.files.folder import RunFolder, as_folder

__all__ = ["LEGACY_KEY", "BlockMeta", "StoreError", "VectorStore", "committed_blocks", "read_manifest",
           "verify_blocks", "write_block"]

FORMAT = 2
MANIFEST = "manifest.json"
DAMAGED = "damaged"  # where blocks refused on reopening or reading are moved
LEGACY_KEY = "imported"  # the key `convalue score` gave every imported row before rows had digests
FLUSH_S = 10.0  # the manifest is rewritten at most this often while blocks arrive (and at the end)
log = logging.getLogger("convalue")


@dataclass(frozen=True)
class BlockMeta:
    """What the manifest keeps of one block: its file, groups with their preview keys, size and checksum."""

    file: str
    groups: list[str]
    keys: list[str]
    size: int
    sha256: str

    @classmethod
    def from_dict(cls, data: dict) -> BlockMeta:
        """A block's entry as the manifest or its sidecar holds it."""
        return cls(file=data["file"], groups=list(data["groups"]), keys=list(data["keys"]), size=int(data["size"]),
                   sha256=data["sha256"])

    @property
    def sidecar(self) -> str:
        """The name of the sidecar that commits the block."""
        return self.file.removesuffix(".parquet") + ".json"


def _per_example_column(per_example: list[np.ndarray], n_examples: list[int], p: int, names: list[str]):
    """A list<fixed_size_list<float32, p>> column: one list of example vectors per group."""
    for name, X, m in zip(names, per_example, n_examples):
        if X.shape != (m, p) or not np.all(np.isfinite(X)):
            raise StoreError(f"group {name!r}: per-example vectors of shape {X.shape} (expected {(m, p)}) "
                             "or with non-finite values")
    flat = np.concatenate(per_example).astype(np.float32).reshape(-1)
    rows = pa.FixedSizeListArray.from_arrays(pa.array(flat, pa.float32()), p)
    offsets = pa.array(np.concatenate([[0], np.cumsum(n_examples)]).astype(np.int32))
    return pa.ListArray.from_arrays(offsets, rows)


def write_block(folder: RunFolder, names: list[str], keys: list[str], n_examples: list[int], n_tokens: list[int],
                vectors: np.ndarray, per_example: list[np.ndarray] | None = None) -> BlockMeta:
    """Write one block of group vectors (and, optionally, each group's per-example vectors) and its sidecar; the
    sidecar, written last, commits the block. Safe to call from any process that can reach the folder."""
    vectors = np.asarray(vectors, dtype=np.float32)
    if vectors.ndim != 2 or vectors.shape[0] != len(names):
        raise StoreError(f"block has {vectors.shape} vectors for {len(names)} groups")
    if not np.all(np.isfinite(vectors)):
        raise StoreError(f"non-finite gradient values in groups {names}")
    p = vectors.shape[1]
    columns = {
        "group": pa.array(names, pa.string()),
        "key": pa.array(keys, pa.string()),
        "n_examples": pa.array(n_examples, pa.int32()),
        "n_tokens": pa.array(n_tokens, pa.int64()),
        "vector": pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1), pa.float32()), p),
    }
    if per_example is not None:
        columns["example_vectors"] = _per_example_column(per_example, n_examples, p, names)
    sink = pa.BufferOutputStream()
    pq.write_table(pa.table(columns), sink)
    data = sink.getvalue().to_pybytes()
    meta = BlockMeta(file=f"block-{uuid.uuid4().hex[:16]}.parquet", groups=list(names), keys=list(keys),
                     size=len(data), sha256=hashlib.sha256(data).hexdigest())
    folder.write_bytes(meta.file, data)
    folder.write_text(meta.sidecar, json.dumps(asdict(meta)))
    return meta


def block_vectors(folder: RunFolder, meta: BlockMeta) -> np.ndarray:
    """One block's vectors ([rows, p] float32), its checksum verified on the bytes read (StoreError if it fails)."""
    data = folder.read_bytes(meta.file)
    if hashlib.sha256(data).hexdigest() != meta.sha256:
        raise StoreError(f"{folder / meta.file}: checksum mismatch; the block was changed or truncated (run the "
                         "config again: the run sets it aside and computes its groups anew)")
    t = pq.read_table(pa.BufferReader(data), columns=["vector"])
    p = t.schema.field("vector").type.list_size
    return t.column("vector").combine_chunks().flatten().to_numpy(zero_copy_only=False).reshape(-1, p)


def read_manifest(folder: RunFolder | Path) -> dict:
    """The manifest of a vector store folder, checked to be one; a StoreError naming it if not."""
    folder = as_folder(folder)
    try:
        manifest = json.loads(folder.read_text(MANIFEST))
    except FileNotFoundError:
        raise StoreError(f"{folder / MANIFEST}: missing (no vectors stored here)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise StoreError(f"{folder / MANIFEST}: not readable JSON ({exc})") from None
    blocks = manifest.get("blocks") if isinstance(manifest, dict) else None
    if not isinstance(blocks, list) or not isinstance(manifest.get("fingerprint"), dict) or not all(
            isinstance(b, dict) and {"file", "groups", "keys", "sha256", "size"} <= set(b) for b in blocks):
        raise StoreError(f"{folder / MANIFEST}: not a vector-store manifest (fingerprint and blocks expected)")
    return manifest


def committed_blocks(folder: RunFolder, manifest: dict) -> dict[str, BlockMeta]:
    """Every committed block: those the manifest lists and those whose sidecar was written since."""
    blocks = {b["file"]: BlockMeta.from_dict(b) for b in manifest.get("blocks", [])}
    for name in folder.names():
        if name.startswith("block-") and name.endswith(".json"):
            try:
                meta = BlockMeta.from_dict(json.loads(folder.read_text(name)))
            except (OSError, ValueError, KeyError, TypeError):
                continue  # a sidecar cut short: its block was never committed
            blocks.setdefault(meta.file, meta)
    return blocks


def verify_blocks(folder: RunFolder, manifest: dict, quick: bool = False) -> list[str]:
    """What is wrong with a store's blocks, one line each: missing, wrong size, checksum mismatch (not hashed when
    quick), a block file no sidecar or manifest commits; [] when the store is sound. Reads only."""
    problems = []
    blocks = committed_blocks(folder, manifest)
    for meta in blocks.values():
        size = folder.size(meta.file)
        if size is None:
            problems.append(f"{folder / meta.file}: missing (groups {meta.groups[:5]})")
        elif size != meta.size:
            problems.append(f"{folder / meta.file}: {size} bytes where {meta.size} were written (groups "
                            f"{meta.groups[:5]})")
        elif not quick and hashlib.sha256(folder.read_bytes(meta.file)).hexdigest() != meta.sha256:
            problems.append(f"{folder / meta.file}: checksum mismatch, the block was changed (groups "
                            f"{meta.groups[:5]})")
    for name in folder.names():
        if name.startswith("block-") and name.endswith(".parquet") and name not in blocks:
            problems.append(f"{folder / name}: no sidecar commits it (a block whose write did not finish)")
    return problems


def fingerprint_matches(folder: RunFolder, fingerprint: dict) -> bool:
    """Whether the folder holds no vectors, or vectors made with these settings (a readable manifest with this
    fingerprint)."""
    if not folder.exists(MANIFEST):
        return True
    try:
        return read_manifest(folder).get("fingerprint") == json.loads(json.dumps(fingerprint, sort_keys=True))
    except StoreError:
        return False


class VectorStore:
    """A run's vectors: the fingerprint (model, LoRA, projection, preview settings) in the manifest, and the
    committed blocks; a group is done when a committed block holds it with the same preview key. Reopening with
    another fingerprint is an error; a block that is missing or damaged is set aside and its groups recomputed."""

    def __init__(self, folder: RunFolder | Path, fingerprint: dict, *, overwrite: bool = False,
                 writable: bool = True):
        self.folder, self.writable = as_folder(folder), writable
        folder = self.folder
        self.fingerprint = json.loads(json.dumps(fingerprint, sort_keys=True))
        self.blocks: dict[str, BlockMeta] = {}
        self.state: dict = {}  # dim, complete, groups, source and row_groups (what an import read)
        self.dropped: list[str] = []  # blocks set aside (missing, changed or truncated)
        self._flushed = 0.0
        if folder.exists(MANIFEST):
            try:
                old = read_manifest(folder)
            except StoreError as exc:
                if not overwrite:
                    raise StoreError(f"{exc}; use another run name/--out, or --overwrite to start it afresh") from None
                old = {"fingerprint": None, "blocks": []}
            if old.get("fingerprint") != self.fingerprint:
                if not overwrite:
                    fp = old.get("fingerprint") or {}
                    diff = sorted(k for k in set(fp) | set(self.fingerprint) if fp.get(k) != self.fingerprint.get(k))
                    raise StoreError(f"{folder / MANIFEST}: stored vectors were made with other settings "
                                     f"(differs in {diff}); use another run name/--out, or --overwrite")
                for name in folder.names():
                    if name.startswith("block-"):
                        folder.delete(name)
            else:
                self.state = {k: old[k] for k in ("dim", "complete", "groups", "source", "row_groups") if k in old}
                for meta in committed_blocks(folder, old).values():
                    if folder.size(meta.file) == meta.size:
                        self.blocks[meta.file] = meta
                    else:
                        self.set_aside(meta, "missing or cut short")
        if writable:
            folder.makedirs()
            self.flush()

    @classmethod
    def reader(cls, folder: RunFolder) -> VectorStore:
        """The store of a finished run, opened to read only (a re-solve, a bootstrap, an import)."""
        return cls(folder, read_manifest(folder)["fingerprint"], writable=False)

    def set_aside(self, meta: BlockMeta, why: str) -> None:
        """Move a damaged block (and its sidecar) to damaged/, never to be read again; its groups are recomputed."""
        self.blocks.pop(meta.file, None)
        self.state.pop("complete", None)
        self.dropped.append(meta.file)
        if not self.writable:
            log.warning("%s: %s; a run of the config sets it aside and computes its groups %s again",
                        self.folder / meta.file, why, meta.groups[:5])
            return
        for name in (meta.file, meta.sidecar):
            if self.folder.is_file(name):
                self.folder.move(name, f"{DAMAGED}/{name}")
        log.warning("%s: %s; set aside in %s; its groups %s are computed again", self.folder / meta.file, why,
                    self.folder / DAMAGED, meta.groups[:5])

    def forget_import(self) -> None:
        """Forget what an earlier import read (its groups, source and row groups; each row stays in its block), so
        that the next import reads and values every row again."""
        for key in ("complete", "groups", "source", "row_groups"):
            self.state.pop(key, None)

    def flush(self) -> None:
        """Write the consolidated manifest (the sidecars stay the blocks' own record)."""
        manifest = {"format": FORMAT, "fingerprint": self.fingerprint, **self.state,
                    "blocks": [asdict(m) for m in self.blocks.values()]}
        self.folder.write_text(MANIFEST, json.dumps(manifest, sort_keys=True))
        self._flushed = time.monotonic()

    def done(self) -> dict[str, str]:
        """Group name -> preview key of every group already stored."""
        return {g: k for m in self.blocks.values() for g, k in zip(m.groups, m.keys)}

    def add(self, meta: BlockMeta, dim: int) -> None:
        """Record a block written (by a worker or here); the manifest follows within FLUSH_S."""
        if self.state.setdefault("dim", dim) != dim:
            raise StoreError(f"block dimension {dim} differs from the store's {self.state['dim']}")
        self.state.pop("complete", None)
        self.blocks[meta.file] = meta
        if time.monotonic() - self._flushed > FLUSH_S:
            self.flush()

    def write_block(self, names: list[str], keys: list[str], n_examples: list[int], n_tokens: list[int],
                    vectors: np.ndarray, per_example: list[np.ndarray] | None = None) -> BlockMeta:
        """Write one block here (see write_block) and record it."""
        meta = write_block(self.folder, names, keys, n_examples, n_tokens, vectors, per_example)
        self.add(meta, int(np.shape(vectors)[1]))
        return meta

    def _tables(self, names: list[str], columns: list[str]) -> Iterator[pa.Table]:
        """The blocks that hold any of `names`, each with those of `columns` it has; each file is read once and
        its checksum verified on the very bytes that are parsed (a mismatch sets the block aside and raises)."""
        wanted = set(names)
        for meta in list(self.blocks.values()):
            if wanted.isdisjoint(meta.groups):
                continue
            try:
                data = self.folder.read_bytes(meta.file)
            except OSError as exc:
                raise StoreError(f"{self.folder / meta.file}: unreadable ({exc})") from None
            if hashlib.sha256(data).hexdigest() != meta.sha256:
                self.set_aside(meta, "checksum mismatch")
                if self.writable:
                    self.flush()
                raise StoreError(f"{self.folder / meta.file}: checksum mismatch; the block was changed or truncated "
                                 "(set aside: run the config again to compute its groups anew)")
            block = pq.ParquetFile(pa.BufferReader(data))
            yield block.read(columns=[c for c in columns if c in block.schema_arrow.names])

    def load(self, names: list[str]) -> tuple[np.ndarray, dict[str, int]]:
        """Vectors for `names` in that order ([N, p] float32) and their n_examples; checksums verified."""
        rows: dict[str, np.ndarray] = {}
        counts: dict[str, int] = {}
        for t in self._tables(names, ["group", "n_examples", "vector"]):
            p = t.schema.field("vector").type.list_size
            vec = t.column("vector").combine_chunks().flatten().to_numpy(zero_copy_only=False).reshape(-1, p)
            for i, (g, m) in enumerate(zip(t.column("group").to_pylist(), t.column("n_examples").to_pylist())):
                rows[g] = vec[i]
                counts[g] = m
        missing = [n for n in names if n not in rows]
        if missing:
            why = (f" (blocks {self.dropped[:5]} were set aside: missing, changed or truncated)"
                   if self.dropped else "")
            raise StoreError(f"{self.folder}: no stored vector for groups {missing[:10]}{why}")
        return np.stack([rows[n] for n in names]), {n: counts[n] for n in names}

    def load_examples(self, names: list[str]) -> dict[str, np.ndarray]:
        """Per-example vectors ([m_i, p] float32) of `names`, for runs with features.keep_per_example."""
        out: dict[str, np.ndarray] = {}
        for t in self._tables(names, ["group", "example_vectors"]):
            if "example_vectors" not in t.column_names:
                continue
            lists = t.column("example_vectors").combine_chunks()
            p = lists.type.value_type.list_size
            offsets = lists.offsets.to_numpy()
            X = lists.values.flatten().to_numpy(zero_copy_only=False).reshape(-1, p)
            for i, g in enumerate(t.column("group").to_pylist()):
                out[g] = X[offsets[i] : offsets[i + 1]]
        missing = [n for n in names if n not in out]
        if missing:
            raise StoreError(f"{self.folder}: no per-example vectors for groups {missing[:10]} "
                             "(they are kept only with features.keep_per_example)")
        return {n: out[n] for n in names}

    def blocks_of(self, names: list[str]) -> list[BlockMeta]:
        """The committed blocks holding any of `names`."""
        wanted = set(names)
        return [m for m in self.blocks.values() if not wanted.isdisjoint(m.groups)]

    def mark_complete(self, names: list[str]) -> None:
        """Record that the store holds every group of the run (and write the manifest)."""
        self.state["complete"] = True
        self.state["groups"] = list(names)
        self.flush()
