"""What a run folder holds and whether it can be trusted (`convalue status RUN_DIR`): every artifact the summary
promises is checked (presence, size, checksum) with the vector store's manifest and blocks; counts are read from
the folder, not the summary; the folder's lock tells a live run from an interrupted one."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

from convalue.engine.data.prepare import TARGET_KEY
from convalue.engine.files.errors import StoreError
from convalue.engine.files.folder import RunFolder, as_folder
from convalue.engine.store.artifacts import npy_digest
from convalue.engine.store.record import STAGING, SUMMARY, SWAP
from convalue.engine.store.summary import RunSummary
from convalue.engine.store.vectors import committed_blocks, read_manifest, verify_blocks

#: the state `convalue status` reports, and its exit code (scripts wait on 3, stop on 1)
EXIT_CODES = {"complete": 0, "failed": 1, "interrupted": 1, "damaged": 1, "running": 3}
#: what a complete summary must hold besides its artifacts
COMPLETE_FIELDS = ("config", "order", "solver", "selected", "artifacts")


@dataclass(frozen=True)
class VectorsState:
    """The vector store as found: groups stored (the target's included) against those the run needs."""

    stored: int
    needed: int | None
    target: bool
    complete: bool
    damaged: list[str]
    verified: str  # "checksums", "files" (--quick) or "manifest" (unreadable)


@dataclass(frozen=True)
class RunStatus:
    """A run folder's state (complete, failed, interrupted, running, damaged), what is wrong with it, and what it
    holds."""

    run_dir: str
    state: str
    summary_status: str | None
    live_process: bool
    problems: list[str] = field(default_factory=list)  # why the folder is damaged, one line each
    vectors: VectorsState | None = None
    finetune_records: int = 0
    attempt: dict | None = None  # a later attempt that did not replace the complete run: its status and error
    failed_stage: str | None = None
    error: str | None = None
    signal: str | None = None
    selected: list[str] | None = None
    timings_s: dict | None = None
    progress: dict | None = None
    finetune_stale: str | None = None
    recovered: dict | None = None
    best_k: dict | None = None
    verdict: dict | None = None

    @property
    def exit_code(self) -> int:
        """0 complete, 1 failed, interrupted or damaged, 3 running."""
        return EXIT_CODES[self.state]

    def to_dict(self) -> dict:
        """As `convalue status --json` prints it."""
        return dataclasses.asdict(self)


def run_status(run_dir: RunFolder | Path | str, quick: bool = False) -> RunStatus:
    """The folder's state, trusting nothing it has not checked: FileNotFoundError where it is no run folder at
    all; a summary.json that cannot be read, an artifact missing or changed, or a vector store short of what the
    summary records make the folder damaged, each problem named."""
    folder = as_folder(run_dir)
    live = folder.held()
    try:
        summary = RunSummary.read(folder)
    except StoreError as exc:
        return RunStatus(str(folder), "damaged", None, live, problems=[str(exc)])
    problems: list[str] = []
    if folder.is_file(f"{STAGING}/{SWAP}") and not live:
        problems.append(f"{folder / STAGING}: a swap of new results was interrupted; the folder mixes two "
                        "attempts (run the same command again to finish it)")
    vectors = _vectors(folder, summary, quick)
    state = _state(summary, live)
    if state == "complete":
        problems += _promises(folder, summary, quick)
        if vectors is None:
            problems.append(f"{folder / 'vectors/manifest.json'}: missing (the summary records stored vectors)")
        else:
            problems += vectors.damaged
            if vectors.needed is not None and vectors.stored < vectors.needed:
                problems.append(f"{folder / 'vectors'}: {vectors.stored} of the {vectors.needed} vectors the run "
                                "recorded are stored")
    if problems and state != "running":
        state = "damaged"
    ev = summary.evaluation if isinstance(summary.evaluation, dict) else {}
    return RunStatus(
        str(folder), state, summary.status, live, problems=problems, vectors=vectors,
        finetune_records=_records(folder.sub("finetunes")), attempt=_attempt(folder, summary),
        failed_stage=summary.failed_stage, error=summary.error, signal=summary.signal, selected=summary.selected,
        timings_s=summary.timings_s, progress=summary.progress, finetune_stale=summary.finetune_stale,
        recovered=summary.recovered, best_k=ev.get("best_k") if isinstance(ev.get("best_k"), dict) else None,
        verdict=ev.get("verdict") if isinstance(ev.get("verdict"), dict) else None)


def _state(summary: RunSummary, live: bool) -> str:
    """The state the summary's status and the folder's lock give (before any artifact is checked)."""
    if summary.status == "running":
        return "running" if live else "interrupted"  # a killed command leaves "running" and no lock holder
    if summary.status == "failed":
        return "interrupted" if summary.signal else "failed"
    if summary.status == "complete":
        return "complete"
    return "damaged"


def _promises(folder: RunFolder, summary: RunSummary, quick: bool) -> list[str]:
    """What a complete summary promises and the folder does not hold: its fields, and each artifact's presence,
    size and (unless quick) checksum."""
    path = folder / SUMMARY
    missing = [f for f in COMPLETE_FIELDS if not getattr(summary, f)]
    if missing:
        return [f"{path}: says complete but lacks {', '.join(f'`{f}`' for f in missing)} (cut down, or written by "
                "an older convalue: run the command again)"]
    problems = []
    if "scores.parquet" not in summary.artifacts:
        problems.append(f"{path}: its artifacts do not list scores.parquet")
    for name, entry in sorted(summary.artifacts.items()):
        if not (isinstance(entry, dict) and isinstance(entry.get("sha256"), str) and type(entry.get("bytes")) is int):
            problems.append(f"{path}: artifact {name!r} is malformed")
            continue
        size = folder.size(name)
        if size is None:
            problems.append(f"{folder / name}: missing")
        elif size != entry["bytes"]:
            problems.append(f"{folder / name}: {size} bytes, the run wrote {entry['bytes']}")
        elif not quick and npy_digest(folder.read_bytes(name)) != entry["sha256"]:
            problems.append(f"{folder / name}: SHA-256 differs from the one summary.json recorded")
    return problems


def _vectors(folder: RunFolder, summary: RunSummary, quick: bool) -> VectorsState | None:
    """The vector store as found in the folder; None where it has no manifest."""
    vectors = folder.sub("vectors")
    if not vectors.exists("manifest.json"):
        return None
    try:
        manifest = read_manifest(vectors)
    except StoreError as exc:
        return VectorsState(0, None, False, False, [str(exc)], "manifest")
    stored = {g for b in committed_blocks(vectors, manifest).values() for g in b.groups}
    data = summary.data or {}
    needed = data.get("candidates") + 1 if type(data.get("candidates")) is int else None
    return VectorsState(len(stored), needed, TARGET_KEY in stored, bool(manifest.get("complete")),
                        verify_blocks(vectors, manifest, quick), "files" if quick else "checksums")


def _attempt(folder: RunFolder, summary: RunSummary) -> dict | None:
    """A later attempt kept in the staging folder beside a complete run (it failed, was stopped, or runs now)."""
    if summary.status != "complete" or not folder.is_file(f"{STAGING}/{SUMMARY}"):
        return None
    try:
        staged = RunSummary.read(folder.sub(STAGING))
    except (StoreError, OSError):
        return {"status": "unreadable"}
    return {"status": staged.status, "failed_stage": staged.failed_stage, "error": staged.error,
            "signal": staged.signal, "progress": staged.progress}


def _records(root: RunFolder) -> int:
    """Finished fine-tunes kept in finetunes/ (every readable record there, whichever settings trained it; the
    base model's loss is not one)."""
    count = 0
    for name in root.names():
        if not name.endswith(".json"):
            continue
        try:
            count += "val_loss" in json.loads(root.read_text(name))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, TypeError):
            continue  # a damaged record is trained again by the next run; it is not a finished fine-tune
    return count
