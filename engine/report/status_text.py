"""`convalue status` and `convalue list` for a person: a run folder's state in a few lines, the runs under a
folder as a table (names escaped: a name cannot forge a row)."""

from __future__ import annotations

from pathlib import Path

import pyarrow.fs as pafs

from convalue.engine.files.errors import StoreError
from convalue.engine.files.folder import RunFolder, as_folder
from convalue.engine.protocol.verdict import verdict_line
from convalue.engine.store.status import RunStatus, run_status
from convalue.engine.store.summary import RunSummary


def escaped(text: object) -> str:
    """Text with control characters (newlines, escapes, ...) written as escapes, so it stays on its line."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in str(text))


def timings_line(timings_s: dict | None) -> str:
    """The time of each stage in one line (`convalue status` and every command that made or changed a run)."""
    return "timings (s): " + ", ".join(f"{k} {x:.1f}" for k, x in (timings_s or {}).items())


def format_status(status: RunStatus) -> str:
    """The status as a few lines for a person."""
    state, lines = status.state, [f"{escaped(status.run_dir)}: {status.state}"]
    if state == "interrupted":
        stopped = f" by {status.signal}" if status.signal else ""
        lines[0] += (f" (stopped{stopped}" + ("" if status.signal else ": summary.json says 'running' but no process "
                                              "holds the folder") + "; run the same command again to resume: the "
                     "stored vectors and fine-tunes are read back)")
    elif state == "running":
        lines[0] += " (a convalue command holds the folder now)"
    elif state == "failed":
        lines.append(f"failed in stage {status.failed_stage or '?'}: {status.error or '?'}")
    if status.problems:
        lines.append(f"DAMAGED ({len(status.problems)}); run the command again to write the results anew:")
        lines += [f"  {escaped(p)}" for p in status.problems]
    if status.attempt is not None:
        a = status.attempt
        why = f" in stage {a.get('failed_stage')}: {a.get('error')}" if a.get("status") == "failed" else ""
        stages = [f"{s} {stage_progress(p)}" for s, p in (a.get("progress") or {}).items()
                  if isinstance(p, dict) and p.get("total")]
        why += f"; {', '.join(stages)}" if stages and a.get("status") == "running" else ""
        lines.append(f"note: a later attempt ({a.get('status')}{why}) did not replace these results; they are "
                     "those of the last complete run")
    v = status.vectors
    if v is not None:
        of = f" of {v.needed}" if v.needed is not None else ""
        sound = "" if v.damaged else f" ({v.verified} verified)"
        lines.append(f"vectors: {v.stored}{of} stored (groups and the target)"
                     f"{', complete' if v.complete and not v.damaged else ''}{sound}")
    lines.append(f"fine-tune records in finetunes/: {status.finetune_records}")
    for stage, p in (status.progress or {}).items():
        if stage == "featurize" and v is not None:
            continue  # the vectors line above counts what is stored, not what the summary last said
        if isinstance(p, dict) and p.get("total"):
            lines.append(f"  {stage}: {stage_progress(p)}")
    if status.timings_s:
        lines.append(timings_line(status.timings_s))
    if status.selected is not None:
        lines.append(f"selected: {', '.join(escaped(s) for s in status.selected) or 'none'}")
    for m, b in (status.best_k or {}).items():
        lines.append(f"  best k of {m}: {b['k']} ({best_k_measure(b)})")
    if status.summary_status == "complete":
        lines.append(verdict_line({"verdict": status.verdict} if status.verdict is not None else None))
    if status.finetune_stale:
        lines.append(f"note: {status.finetune_stale}")
    return "\n".join(lines)


def stage_progress(p: dict) -> str:
    """One stage's progress: `22 of 60 in 31.5 s`, or `22 of 60 so far` while it runs (no time yet)."""
    seconds = p.get("seconds")
    took = f"in {seconds:.1f} s" if isinstance(seconds, (int, float)) else "so far"
    return f"{p.get('done')} of {p['total']} {took}"


def best_k_measure(best: dict) -> str:
    """What decided a best k, as `select_by` named it: `greetings loss 2.8843 ± 0.0188` (the target's validation loss
    where the run names no evaluation, or a summary from before evaluations were named)."""
    if best.get("evaluation") and best.get("value") is not None:
        value, sd, what = best["value"], best.get("value_sd"), f"{best['evaluation']} {best.get('metric', 'loss')}"
    else:
        value, sd, what = best["val_loss"], best.get("val_loss_sd"), "validation loss"
    return f"{what} {value:.4f}" + (f" ± {sd:.4f}" if sd is not None else "")


def list_runs(runs_dir: RunFolder | Path | str) -> list[dict]:
    """One row per run folder under runs_dir (a folder with summary.json): name, state (checked as `status
    --quick` checks it), target, candidates, representation, solver, selection and KMM's best k. A folder that
    cannot be read is listed as damaged with the reason; the others are listed all the same."""
    root = as_folder(runs_dir)
    kind = root.fs.get_file_info(root.path()).type
    if kind != pafs.FileType.Directory:
        raise StoreError(f"{runs_dir}: " + ("no such folder" if kind == pafs.FileType.NotFound else "not a folder"))
    rows = []
    for info in sorted(root.fs.get_file_info(pafs.FileSelector(root.path())), key=lambda i: i.base_name):
        folder = root.sub(info.base_name)
        if info.type != pafs.FileType.Directory or not folder.is_file("summary.json"):
            continue
        rows.append(_row(info.base_name, folder))
    return rows


def _row(name: str, folder: RunFolder) -> dict:
    """One run's row; anything unexpected in the folder makes it a damaged row naming why."""
    try:
        status = run_status(folder, quick=True)
        s = RunSummary.read(folder) if status.summary_status is not None else None
    except Exception as exc:  # one broken folder never hides the runs beside it
        return {"name": name, "status": "damaged", "error": f"{type(exc).__name__}: {exc}"}
    row = {"name": name, "status": status.state, "error": status.problems[0] if status.problems else None,
           "failed_stage": status.failed_stage, "selected": status.selected}
    if s is None:
        return row
    data = s.data if isinstance(s.data, dict) else {}
    best = ((status.best_k or {}).get("kmm") or {}) if isinstance((status.best_k or {}).get("kmm"), dict) else {}
    return row | {"target": data.get("target"), "candidates": data.get("candidates"),
                  "representation": s.config_section("features").get("representation"),
                  "solver": s.solver.describe() if s.solver else None, "best_k": best.get("k"),
                  "best": best_k_measure(best) if "val_loss" in best else None}


def format_runs(rows: list[dict]) -> str:
    """The runs as a table for a person (every text escaped: one row per run, whatever its name)."""
    if not rows:
        return "no run folders here"
    lines = [f"{'run':20s} {'status':12s} {'target':16s} {'cand':>5s}  top picks"]
    for r in rows:
        picks = ", ".join(escaped(p) for p in (r.get("selected") or [])[:5]) or "-"
        if r["status"] == "failed":
            picks = f"(failed in {escaped(r.get('failed_stage') or '?')})"
        elif r["status"] == "damaged":
            picks = f"({escaped(r.get('error') or 'damaged')[:100]})"
        best = f"  [KMM best k={r['best_k']}: {r['best']}]" if r.get("best") else ""
        cand = r.get("candidates")
        lines.append(f"{escaped(r['name'])[:20]:20s} {r['status']:12s} {escaped(r.get('target') or '-')[:16]:16s} "
                     f"{cand if isinstance(cand, int) else '-':>5}  {picks}{best}")
    return "\n".join(lines)
