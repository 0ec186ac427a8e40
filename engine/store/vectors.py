"""Projected vectors persisted as checksummed Parquet blocks under a manifest (exact resume)."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

FORMAT = 1
DAMAGED = "damaged"  # where blocks refused on reopening are moved
log = logging.getLogger("convalue")


class StoreError(RuntimeError):
    """The vector store is inconsistent with the run asking for it."""


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _atomic_json(path: Path, data: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True), encoding="utf-8")
    os.replace(tmp, path)


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


def read_manifest(root: Path) -> dict:
    """The manifest.json of a vector store folder, checked to be a manifest; a StoreError naming it if not."""
    path = Path(root) / "manifest.json"
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise StoreError(f"{path}: missing (no vectors stored here)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise StoreError(f"{path}: not readable JSON ({exc})") from None
    blocks = manifest.get("blocks") if isinstance(manifest, dict) else None
    if not isinstance(blocks, list) or not isinstance(manifest.get("fingerprint"), dict) or not all(
            isinstance(b, dict) and {"file", "groups", "keys", "sha256"} <= set(b) for b in blocks):
        raise StoreError(f"{path}: not a vector-store manifest (fingerprint and blocks expected)")
    return manifest


def verify_blocks(root: Path, manifest: dict, quick: bool = False) -> list[str]:
    """What is wrong with a store's blocks, one line each: missing, checksum mismatch (not checked when quick), a
    block file on disk the manifest does not list; [] when the store is sound. Reads only."""
    root, problems = Path(root), []
    listed = {b["file"] for b in manifest["blocks"]}
    for b in manifest["blocks"]:
        path = root / b["file"]
        if not path.is_file():
            problems.append(f"{path}: missing (groups {b['groups'][:5]})")
        elif not quick and _sha256(path) != b["sha256"]:
            problems.append(f"{path}: checksum mismatch, the block was changed or truncated (groups {b['groups'][:5]})")
    for path in sorted(root.glob("block-*.parquet")):
        if path.name not in listed:
            problems.append(f"{path}: not listed in the manifest (a block whose write did not finish)")
    return problems


class VectorStore:
    """A folder of Parquet blocks (group, key, n_examples, n_tokens, vector) and manifest.json.

    The manifest holds the fingerprint (model, LoRA, projection, preview settings) and, per block, its
    file, its groups with their preview keys, and its sha256; a group is done when a checksummed block
    holds it with the same preview key. Reopening with another fingerprint is an error.
    """

    def __init__(self, root: Path, fingerprint: dict, *, overwrite: bool = False):
        self.root = Path(root)
        self.fingerprint = json.loads(json.dumps(fingerprint, sort_keys=True))
        self.manifest_path = self.root / "manifest.json"
        self.manifest: dict = {"format": FORMAT, "fingerprint": self.fingerprint, "blocks": []}
        self.dropped: list[str] = []  # blocks refused on reopen (missing, changed or truncated)
        if self.manifest_path.exists():
            try:
                old = read_manifest(self.root)
            except StoreError as exc:
                if not overwrite:
                    raise StoreError(f"{exc}; use another run name/--out, or --overwrite to start it afresh") from None
                old = {"blocks": [{"file": f.name} for f in self.root.glob("block-*.parquet")]}
            if old.get("fingerprint") != self.fingerprint:
                if not overwrite:
                    diff = sorted(k for k in set(old.get("fingerprint", {})) | set(self.fingerprint)
                                  if old.get("fingerprint", {}).get(k) != self.fingerprint.get(k))
                    raise StoreError(f"{self.manifest_path}: stored vectors were made with other settings "
                                     f"(differs in {diff}); use another run name/--out, or --overwrite")
                for b in old.get("blocks", []):
                    (self.root / b["file"]).unlink(missing_ok=True)
            else:
                valid = [self._valid(b) for b in old["blocks"]]
                self.manifest = old | {"blocks": [b for b, ok in zip(old["blocks"], valid) if ok]}
                self.dropped = [b["file"] for b, ok in zip(old["blocks"], valid) if not ok]
                if self.dropped:
                    self._incomplete()
                    self._set_aside(self.dropped)
        self.root.mkdir(parents=True, exist_ok=True)
        _atomic_json(self.manifest_path, self.manifest)

    def _valid(self, block: dict) -> bool:
        path = self.root / block["file"]
        return path.is_file() and _sha256(path) == block["sha256"]

    def _set_aside(self, files: list[str]) -> None:
        """Move damaged blocks to damaged/ (kept for a look, never read again); their groups are computed again."""
        aside = self.root / DAMAGED
        for name in files:
            path = self.root / name
            if path.exists():
                aside.mkdir(exist_ok=True)
                os.replace(path, aside / name)
            log.warning("%s: %s (checksum mismatch or unreadable); %s; its groups are computed again", path,
                        "damaged" if (aside / name).exists() else "missing",
                        f"moved to {aside / name}" if (aside / name).exists() else "dropped from the manifest")

    def _incomplete(self) -> None:
        """Drop the complete mark: the store no longer holds exactly what the last finished run stored."""
        self.manifest.pop("complete", None)
        self.manifest.pop("groups", None)

    def done(self) -> dict[str, str]:
        """Group name -> preview key of every group already stored."""
        return {g: k for b in self.manifest["blocks"] for g, k in zip(b["groups"], b["keys"])}

    def write_block(self, names: list[str], keys: list[str], n_examples: list[int], n_tokens: list[int],
                    vectors: np.ndarray, per_example: list[np.ndarray] | None = None) -> None:
        """Persist one block (and, optionally, each group's per-example vectors) in the manifest, atomically."""
        vectors = np.asarray(vectors, dtype=np.float32)
        if vectors.ndim != 2 or vectors.shape[0] != len(names):
            raise StoreError(f"block has {vectors.shape} vectors for {len(names)} groups")
        if not np.all(np.isfinite(vectors)):
            raise StoreError(f"non-finite gradient values in groups {names}")
        p = vectors.shape[1]
        dim = self.manifest.setdefault("dim", p)
        if dim != p:
            raise StoreError(f"block dimension {p} differs from the store's {dim}")
        idx = max((int(b["file"][6:12]) for b in self.manifest["blocks"]), default=-1) + 1
        name = f"block-{idx:06d}.parquet"
        columns = {
            "group": pa.array(names, pa.string()),
            "key": pa.array(keys, pa.string()),
            "n_examples": pa.array(n_examples, pa.int32()),
            "n_tokens": pa.array(n_tokens, pa.int64()),
            "vector": pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1), pa.float32()), p),
        }
        if per_example is not None:
            columns["example_vectors"] = _per_example_column(per_example, n_examples, p, names)
        table = pa.table(columns)
        tmp = self.root / (name + ".tmp")
        self._incomplete()
        pq.write_table(table, tmp)
        os.replace(tmp, self.root / name)
        self.manifest["blocks"].append({"file": name, "groups": list(names), "keys": list(keys),
                                        "sha256": _sha256(self.root / name)})
        _atomic_json(self.manifest_path, self.manifest)

    def _tables(self, names: list[str], columns: list[str]) -> Iterator[pa.Table]:
        """The blocks that hold any of `names`, each with those of `columns` it has; each file is read once and
        its checksum verified on the very bytes that are parsed."""
        wanted = set(names)
        for b in self.manifest["blocks"]:
            if wanted.isdisjoint(b["groups"]):
                continue
            path = self.root / b["file"]
            try:
                data = path.read_bytes()
            except OSError as exc:
                raise StoreError(f"{path}: unreadable ({exc})") from None
            if hashlib.sha256(data).hexdigest() != b["sha256"]:
                raise StoreError(f"{path}: checksum mismatch; the block was changed or truncated")
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
            why = (f" (blocks {self.dropped[:5]} were refused on opening: missing, changed or truncated)"
                   if self.dropped else "")
            raise StoreError(f"{self.root}: no stored vector for groups {missing[:10]}{why}")
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
            raise StoreError(f"{self.root}: no per-example vectors for groups {missing[:10]} "
                             "(they are kept only with features.keep_per_example)")
        return {n: out[n] for n in names}

    def mark_complete(self, names: list[str]) -> None:
        """Record that the store holds every group of the run."""
        self.manifest["complete"] = True
        self.manifest["groups"] = list(names)
        _atomic_json(self.manifest_path, self.manifest)
