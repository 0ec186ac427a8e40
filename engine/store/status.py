"""What a run folder holds and whether a process is still writing it (`convalue status RUN_DIR`): a killed run's
summary.json still says "running", so the folder's lock tells a live run from an interrupted one."""

from __future__ import annotations

import json
from pathlib import Path

from convalue.engine.data.prepare import TARGET_KEY
from convalue.engine.files.errors import StoreError
from convalue.engine.files.folder import RunFolder, as_folder
from convalue.engine.store.artifacts import npy_digest
from convalue.engine.store.summary import RunSummary
from convalue.engine.store.vectors import committed_blocks, read_manifest, verify_blocks

#: the state `convalue status` reports, and its exit code (scripts wait on 3, stop on 1)
EXIT_CODES = {"complete": 0, "failed": 1, "interrupted": 1, "damaged": 1, "running": 3}


def run_status(run_dir: RunFolder | Path | str, quick: bool = False) -> dict:
    """The folder's state (complete, failed, running: a live process holds it, interrupted: none does), what it
    stores (vectors, verified against the manifest and its checksums unless quick; fine-tune records) and, from
    summary.json, its progress, selection and failure."""
    run_dir = as_folder(run_dir)
    summary = RunSummary.read(run_dir)
    written = summary.status
    live = run_dir.held()
    if written in ("running", "resolving"):
        state = "running" if live else "interrupted"
    else:
        state = "failed" if written == "failed" else "complete"
    out = {"run_dir": str(run_dir), "state": state, "summary_status": written, "live_process": live,
           "command": "solve" if written == "resolving" else "run",
           "vectors": _vectors(run_dir, summary, quick), "finetune_records": _records(run_dir.sub("finetunes")),
           "arrays": _arrays(run_dir, summary, quick)}
    if state == "complete" and out["vectors"] is not None and out["vectors"]["damaged"]:
        out["state"] = "damaged"  # the results stand, but a rerun or re-solve from vectors would recompute
    if state == "complete" and out["arrays"]:
        out["state"] = "damaged"  # `convalue solve` refuses these arrays; a rerun writes them again
    for field in ("failed_stage", "error", "signal", "selected", "timings_s", "progress", "finetune_stale",
                  "recovered"):
        if getattr(summary, field) is not None:
            out[field] = getattr(summary, field)
    if summary.evaluation is not None and isinstance(summary.evaluation.get("best_k"), dict):
        out["best_k"] = summary.evaluation["best_k"]
    return out


def _vectors(run_dir: RunFolder, summary: RunSummary, quick: bool) -> dict | None:
    """Group vectors stored (the target's included) against those the run needs, and what is damaged; None before
    the store exists."""
    vectors = run_dir.sub("vectors")
    try:
        manifest = read_manifest(vectors)
    except StoreError as exc:
        if not vectors.exists("manifest.json"):
            return None
        return {"stored": 0, "needed": None, "target": False, "complete": False, "damaged": [str(exc)],
                "verified": "manifest"}
    stored = {g for b in committed_blocks(vectors, manifest).values() for g in b.groups}
    data = summary.data or {}
    needed = data.get("candidates") + 1 if isinstance(data.get("candidates"), int) else None
    return {"stored": len(stored), "needed": needed, "target": TARGET_KEY in stored,
            "complete": bool(manifest.get("complete")), "damaged": verify_blocks(vectors, manifest, quick),
            "verified": "files" if quick else "checksums"}


def _arrays(run_dir: RunFolder, summary: RunSummary, quick: bool) -> list[str]:
    """The saved arrays (gram.npy, beta.npy, ...) that are missing or, unless quick, not the bytes the run wrote."""
    damaged = []
    for name, sha in (summary.checksums or {}).items():
        if not run_dir.is_file(name):
            damaged.append(f"{name}: missing")
        elif not quick and npy_digest(run_dir.read_bytes(name)) != sha:
            damaged.append(f"{name}: SHA-256 differs from the one summary.json recorded")
    return damaged


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


def format_status(status: dict) -> str:
    """The status as a few lines for a person."""
    state, lines = status["state"], [f"{status['run_dir']}: {status['state']}"]
    if state == "interrupted":
        again = ("run `convalue solve` on it again (its results before the re-solve are kept)"
                 if status["command"] == "solve" else "run the same config again to resume: the stored vectors "
                 "and fine-tunes are read back")
        lines[0] += (f" (summary.json says {status['summary_status']!r} but no process holds the folder: the "
                     f"{status['command']} was stopped or its machine went down; {again})")
    elif state == "running":
        lines[0] += f" (a convalue {status['command']} holds the folder now)"
    if state == "failed":
        lines.append(f"failed in stage {status.get('failed_stage', '?')}: {status.get('error', '?')}")
    v = status["vectors"]
    if v is not None:
        of = f" of {v['needed']}" if v["needed"] is not None else ""
        sound = "" if v["damaged"] else f" ({v['verified']} verified)"
        lines.append(f"vectors: {v['stored']}{of} stored (groups and the target)"
                     f"{', complete' if v['complete'] and not v['damaged'] else ''}{sound}")
        if v["damaged"]:
            lines.append(f"vectors DAMAGED ({len(v['damaged'])}); a rerun of the config sets these blocks aside and "
                         "computes their groups again:")
            lines += [f"  {line}" for line in v["damaged"]]
    if status.get("arrays"):
        lines.append(f"saved arrays DAMAGED ({len(status['arrays'])}); rerun the config to write them again:")
        lines += [f"  {line}" for line in status["arrays"]]
    lines.append(f"fine-tune records in finetunes/: {status['finetune_records']}")
    for stage, p in (status.get("progress") or {}).items():
        if isinstance(p, dict) and p.get("total"):
            lines.append(f"  {stage}: {p.get('done')} of {p['total']} in {p.get('seconds', 0):.1f} s")
    if status.get("timings_s"):
        lines.append("timings (s): " + ", ".join(f"{k} {v:.1f}" for k, v in status["timings_s"].items()))
    if status.get("selected") is not None:
        lines.append(f"selected: {', '.join(status['selected']) or 'none'}")
    for m, b in (status.get("best_k") or {}).items():
        sd = f" ± {b['val_loss_sd']:.4f}" if b.get("val_loss_sd") is not None else ""
        lines.append(f"  best k of {m}: {b['k']} (validation loss {b['val_loss']:.4f}{sd})")
    if status.get("finetune_stale"):
        lines.append(f"note: {status['finetune_stale']}")
    return "\n".join(lines)
