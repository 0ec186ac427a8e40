"""The run's artifact writers and readers: Parquet tables, checksummed arrays, JSON, with atomic writes on any
pyarrow filesystem; the package versions a run records."""

from __future__ import annotations

import hashlib
import importlib.metadata
import io
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from convalue.engine.files.folder import RunFolder, as_folder

PACKAGES = ("convalue", "torch", "transformers", "peft", "ray", "cvxpy", "osqp", "numpy", "pyarrow", "scikit-learn")


def write_parquet(table: pa.Table, folder: RunFolder | Path, name: str) -> None:
    """Write a Parquet file atomically into a run folder (local or remote)."""
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    as_folder(folder).write_bytes(name, sink.getvalue().to_pybytes())



def write_npy(array: np.ndarray, folder: RunFolder | Path, name: str) -> str:
    """Write a .npy array atomically into a run folder; the SHA-256 of the bytes written."""
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    data = buf.getvalue()
    as_folder(folder).write_bytes(name, data)
    return npy_digest(data)



def npy_digest(data: bytes) -> str:
    """The checksum summary.json records for a saved array's bytes (SHA-256, hex)."""
    return hashlib.sha256(data).hexdigest()



def read_npy(folder: RunFolder | Path, name: str, sha256: str | None = None) -> np.ndarray:
    """A .npy array of a run folder (ValueError or OSError where it is not one, or not the bytes whose SHA-256 was
    recorded)."""
    data = as_folder(folder).read_bytes(name)
    if sha256 is not None and npy_digest(data) != sha256:
        raise ValueError("its bytes are not those the run wrote (SHA-256 differs from summary.json's checksums)")
    if data[:6] != b"\x93NUMPY":
        raise ValueError("no .npy header")
    return np.load(io.BytesIO(data), allow_pickle=False)



def write_json(data: dict, folder: RunFolder | Path, name: str) -> None:
    """Write a JSON file atomically into a run folder."""
    as_folder(folder).write_text(name, json.dumps(data, indent=2, default=_jsonable))



def _jsonable(x):
    if isinstance(x, (np.floating, np.integer)):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, Path):
        return str(x)
    raise TypeError(f"not JSON serialisable: {type(x).__name__}")



def package_versions(packages: tuple[str, ...] = PACKAGES) -> dict[str, str | None]:
    """Installed versions of the packages that decide the numbers."""
    out = {}
    for p in packages:
        try:
            out[p] = importlib.metadata.version(p)
        except importlib.metadata.PackageNotFoundError:
            out[p] = None
    return out
