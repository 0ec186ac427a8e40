"""`convalue list RUNS_DIR`: the runs under a folder, each with its status, question and top picks."""

from __future__ import annotations

from pathlib import Path

import pyarrow.fs as pafs

from convalue.engine.files.errors import StoreError
from convalue.engine.files.folder import RunFolder, as_folder
from convalue.engine.store.summary import RunSummary


def list_runs(runs_dir: RunFolder | Path | str) -> list[dict]:
    """One row per run folder under runs_dir (a folder with summary.json): name, status, target, candidates,
    representation, solver, selection and the KMM's best k; folders that are not runs are left out."""
    root = as_folder(runs_dir)
    kind = root.fs.get_file_info(root.path()).type
    if kind != pafs.FileType.Directory:
        raise StoreError(f"{runs_dir}: " + ("no such folder" if kind == pafs.FileType.NotFound else "not a folder"))
    infos = root.fs.get_file_info(pafs.FileSelector(root.path()))
    rows = []
    for info in sorted(infos, key=lambda i: i.base_name):
        if info.type != pafs.FileType.Directory:
            continue
        folder = root.sub(info.base_name)
        if not folder.is_file("summary.json"):
            continue
        try:
            s = RunSummary.read(folder)
        except (StoreError, OSError) as exc:
            rows.append({"name": info.base_name, "status": "unreadable", "error": str(exc)})
            continue
        live = s.status in ("running", "resolving") and folder.held()
        status = s.status if s.status not in ("running", "resolving") else ("running" if live else "interrupted")
        best = ((s.evaluation or {}).get("best_k") or {}).get("kmm") or {}
        rows.append({"name": info.base_name, "status": status, "target": (s.data or {}).get("target"),
                     "candidates": (s.data or {}).get("candidates"),
                     "representation": s.config_section("features").get("representation"),
                     "solver": s.solver.describe() if s.solver else None, "selected": s.selected,
                     "best_k": best.get("k"), "val_loss": best.get("val_loss"), "failed_stage": s.failed_stage})
    return rows


def format_runs(rows: list[dict]) -> str:
    """The runs as a table for a person."""
    if not rows:
        return "no run folders here"
    lines = [f"{'run':20s} {'status':12s} {'target':16s} {'cand':>5s}  top picks"]
    for r in rows:
        picks = ", ".join((r.get("selected") or [])[:5]) or "-"
        if r["status"] == "failed":
            picks = f"(failed in {r.get('failed_stage') or '?'})"
        best = f"  [KMM best k={r['best_k']}: {r['val_loss']:.4f}]" if r.get("val_loss") is not None else ""
        lines.append(f"{r['name'][:20]:20s} {r['status']:12s} {str(r.get('target') or '-')[:16]:16s} "
                     f"{r.get('candidates') if r.get('candidates') is not None else '-':>5}  {picks}{best}")
    return "\n".join(lines)
