"""The run record: the one owner of a run folder. It resolves the folder once from `(out, name)`, writes every
artifact of an attempt into a staging folder (atomically, each with its SHA-256 and size in the summary's
manifest), and swaps them in only when the attempt is complete: a finished run is never replaced by a part of
another. An attempt that fails or is interrupted leaves a complete run as it was (its own summary stays in the
staging folder); on a folder without a complete run it is moved in, so the folder says how it failed."""

from __future__ import annotations

import io
import json
import logging
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from convalue.engine.files.errors import StoreError
from convalue.engine.files.folder import RunFolder
from convalue.engine.store.artifacts import npy_digest
from convalue.engine.store.summary import RunSummary

log = logging.getLogger("convalue")

#: where an attempt writes until it is complete (inside the run folder, so a swap never crosses filesystems)
STAGING = ".staging"
#: the staged summary's marker that the swap has begun: a folder holding it is finished by the next writer
SWAP = "SWAP.json"
#: every file a run, a re-solve or an analysis may leave in the folder: replaced together, never mixed
RESULT_FILES = ("scores.parquet", "path.parquet", "path.png", "gram.npy", "beta.npy", "costs.npy", "clusters.parquet",
                "examples.parquet", "bootstrap.parquet", "evaluation.parquet", "scores.png", "evaluation.png", "curves.png",
                "faithfulness.parquet", "faithfulness.png", "transfer.parquet", "transfer.png", "valuation.npz",
                *(f"{kind}-{tag}.npy" for tag in ("one_step", "tv", "grpo") for kind in ("gram", "beta")))
#: views of the record, rendered again at will (`convalue report`): present, not checksummed
VIEWS = ("report.html",)
SUMMARY = "summary.json"


def run_folder_of(out: str, name: str) -> RunFolder:
    """The run folder `<out>/<name>` (a local path or a filesystem URI): the one place a run's folder is derived."""
    return RunFolder.at(out, name)


@dataclass(frozen=True)
class Artifact:
    """One file the record wrote: its name in the run folder, SHA-256 and size."""

    name: str
    sha256: str
    bytes: int

    def to_dict(self) -> dict:
        """As summary.json's `artifacts` holds it (keyed by name)."""
        return {"sha256": self.sha256, "bytes": self.bytes}


def holds_complete_run(folder: RunFolder) -> bool:
    """Whether the folder's summary.json records a complete run (one a later attempt must not destroy)."""
    try:
        return RunSummary.read(folder).status == "complete"
    except (FileNotFoundError, StoreError, OSError):
        return False


class RunRecord:
    """One attempt's writer of a run folder (hold the folder's lock while using it)."""

    def __init__(self, folder: RunFolder):
        self.folder = folder
        self.staging = folder.sub(STAGING)
        self.artifacts: dict[str, Artifact] = {}
        self.carried: set[str] = set()  # artifacts of the complete run kept as they are (a re-solve's gram.npy)
        self.folders: list[str] = []  # sub-folders staged whole (vectors replaced under --overwrite)
        self.protects = False  # whether the folder holds a complete run this attempt must not destroy

    @classmethod
    def of(cls, out: str, name: str) -> RunRecord:
        """The record of the run folder `<out>/<name>`."""
        return cls(run_folder_of(out, name))

    def open(self) -> None:
        """Take up the folder (holding its lock): finish a swap an earlier attempt began, clear what an earlier
        attempt staged, and note whether the folder holds a complete run this attempt must not destroy."""
        self.folder.makedirs()
        self._finish_swap()
        self._clear(self.staging)
        self.protects = holds_complete_run(self.folder)

    def begin(self, summary: RunSummary) -> None:
        """Write the attempt's first summary ("running"): to the staging folder, and to the folder itself when it
        holds no complete run (so `status` and `list` see the attempt)."""
        self._write_summary(summary, main=not self.protects)

    def staged(self, name: str) -> RunFolder:
        """A sub-folder written whole by this attempt (`vectors` replaced under --overwrite), swapped in at the end."""
        self.folders.append(name)
        sub = self.staging.sub(name)
        self._clear(sub)
        return sub

    # --- the artifact writers: each writes into the staging folder and records what it wrote

    def write_bytes(self, name: str, data: bytes) -> Artifact:
        """Write an artifact's bytes (atomically) and record its checksum and size."""
        if name in VIEWS or name == SUMMARY:
            raise ValueError(f"{name} is written by the record itself, not as an artifact")
        self.staging.write_bytes(name, data)
        art = Artifact(name, npy_digest(data), len(data))
        self.artifacts[name] = art
        self.carried.discard(name)
        return art

    def write_parquet(self, name: str, table: pa.Table) -> Artifact:
        """A Parquet table."""
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink)
        return self.write_bytes(name, sink.getvalue().to_pybytes())

    def write_npy(self, name: str, array: np.ndarray) -> Artifact:
        """A .npy array (no pickles)."""
        buf = io.BytesIO()
        np.save(buf, array, allow_pickle=False)
        return self.write_bytes(name, buf.getvalue())

    def write_png(self, name: str, png: bytes | None) -> Artifact | None:
        """A PNG figure's bytes (None: no figure was drawn)."""
        return None if png is None else self.write_bytes(name, png)

    def carry(self, names: list[str], old: RunSummary) -> None:
        """Keep these artifacts of the complete run as they are (recorded with their old checksums)."""
        for name in names:
            entry = (old.artifacts or {}).get(name)
            if entry is not None and name not in self.artifacts:
                self.artifacts[name] = Artifact(name, entry["sha256"], entry["bytes"])
                self.carried.add(name)

    def manifest(self) -> dict[str, dict]:
        """summary.json's `artifacts`: every file this attempt leaves in the folder, by name."""
        return {name: a.to_dict() for name, a in sorted(self.artifacts.items())}

    # --- the end of an attempt

    def finish(self, summary: RunSummary) -> RunFolder:
        """End the attempt with its final summary: swapped in when the attempt is complete or the folder holds no
        complete run; else kept in the staging folder beside the complete run, which stays as it was. Returns the
        folder that now holds the attempt's result (for its report.html)."""
        summary.artifacts = self.manifest()
        self._write_summary(summary, main=False)
        if summary.status != "complete" and self.protects:
            log.warning("the complete run in %s is kept as it was; this attempt's summary is in %s", self.folder,
                        self.staging / SUMMARY)
            return self.staging
        plan = {"files": sorted(set(self.artifacts) - self.carried), "folders": self.folders,
                "delete": sorted(set(RESULT_FILES) - set(self.artifacts))}
        self.staging.write_text(SWAP, json.dumps(plan))
        self._finish_swap()
        return self.folder

    def write_view(self, folder: RunFolder, html: str) -> None:
        """report.html (a view of the record, rendered again by `convalue report`) into `folder`."""
        folder.write_text(VIEWS[0], html)

    def _finish_swap(self) -> None:
        """Move a staged attempt in (the plan in SWAP.json; summary.json last), then clear the staging folder: run
        again after an interruption, it completes what was begun."""
        if not self.staging.is_file(SWAP):
            return
        plan = json.loads(self.staging.read_text(SWAP))
        for name in plan["delete"]:
            self.folder.delete(name)
        for name in plan["files"]:
            if self.staging.is_file(name):  # replaces the old file in one rename (locally)
                self.folder.move(f"{STAGING}/{name}", name)
        for name in plan["folders"]:
            if self.staging.is_dir(name):
                self._clear(self.folder.sub(name))
                self.folder.move(f"{STAGING}/{name}", name)
        if self.staging.is_file(SUMMARY):
            self.folder.move(f"{STAGING}/{SUMMARY}", SUMMARY)
        self._clear(self.staging)

    def _write_summary(self, summary: RunSummary, main: bool) -> None:
        self.staging.makedirs()
        summary.write(self.staging)
        if main:
            summary.write(self.folder)

    @staticmethod
    def _clear(folder: RunFolder) -> None:
        if folder.exists():
            folder.fs.delete_dir(folder.root)
