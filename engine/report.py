"""Result tables and files: scores.parquet, gram/beta, summary.json, and the printed ranking."""

from __future__ import annotations

import importlib.metadata
import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from engine.data import Group
from engine.select import ranks

PACKAGES = ("convalue", "torch", "transformers", "peft", "ray", "cvxpy", "osqp", "numpy", "pyarrow", "scikit-learn")


def scores_table(names: list[str], n_examples: list[int], n_preview: list[int], w: np.ndarray,
                 beta: np.ndarray, cos: np.ndarray, selected: list[int]) -> pa.Table:
    """One row per candidate, sorted by rank (1 = best)."""
    r = ranks(w, beta)
    sel = np.zeros(len(names), dtype=bool)
    sel[selected] = True
    order = np.argsort(r)
    return pa.table({
        "group": pa.array([names[i] for i in order], pa.string()),
        "n_examples": pa.array([n_examples[i] for i in order], pa.int64()),
        "n_preview": pa.array([n_preview[i] for i in order], pa.int64()),
        "score": pa.array(np.asarray(w, dtype=np.float64)[order]),
        "beta": pa.array(np.asarray(beta, dtype=np.float64)[order]),
        "cosine": pa.array(np.asarray(cos, dtype=np.float64)[order]),
        "rank": pa.array(r[order], pa.int64()),
        "selected": pa.array(sel[order]),
    })


def clusters_table(groups: list[Group], valued: set[str]) -> pa.Table | None:
    """Which example of a flat pool went to which cluster: one row per example of the clustered groups (or None).

    valued: the groups the run scores (a cluster smaller than the preview may be skipped).
    """
    rows = [(g.name, src, i, ex) for g in groups if g.members is not None
            for (src, i), ex in zip(g.members, g.examples)]
    if not rows:
        return None

    def first(ex, role: str) -> str:
        return next((c for r, c in ex.messages if r == role), "")

    return pa.table({
        "group": pa.array([r[0] for r in rows], pa.string()),
        "source_group": pa.array([r[1] for r in rows], pa.string()),
        "index": pa.array([r[2] for r in rows], pa.int64()),
        "prompt": pa.array([first(r[3], "user") for r in rows], pa.string()),
        "response": pa.array([first(r[3], "assistant") for r in rows], pa.string()),
        "valued": pa.array([r[0] in valued for r in rows], pa.bool_()),
    })


def write_parquet(table: pa.Table, path: Path) -> None:
    """Write atomically (no half-written file under the final name)."""
    tmp = path.with_name(path.name + ".tmp")
    pq.write_table(table, tmp)
    os.replace(tmp, path)


def write_npy(array: np.ndarray, path: Path) -> None:
    """Save atomically."""
    tmp = path.with_name(path.name + ".tmp.npy")
    np.save(tmp, array)
    os.replace(tmp, path)


def write_json(data: dict, path: Path) -> None:
    """Write atomically."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=_jsonable), encoding="utf-8")
    os.replace(tmp, path)


def _jsonable(x):
    if isinstance(x, (np.floating, np.integer)):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, Path):
        return str(x)
    raise TypeError(f"not JSON serialisable: {type(x).__name__}")


def package_versions() -> dict[str, str | None]:
    """Installed versions of the packages that decide the numbers."""
    out = {}
    for p in PACKAGES:
        try:
            out[p] = importlib.metadata.version(p)
        except importlib.metadata.PackageNotFoundError:
            out[p] = None
    return out


def format_ranking(table: pa.Table, limit: int | None = None) -> str:
    """The ranked table as aligned text."""
    rows = table.to_pylist()[:limit]
    width = max([len("group")] + [len(r["group"]) for r in rows])
    lines = [f"{'rank':>4}  {'group':<{width}}  {'score':>10}  {'beta':>10}  {'cosine':>7}  {'n':>5}  sel"]
    for r in rows:
        lines.append(f"{r['rank']:>4}  {r['group']:<{width}}  {r['score']:>10.4f}  {r['beta']:>10.3e}  "
                      f"{r['cosine']:>7.3f}  {r['n_examples']:>5}  {'*' if r['selected'] else ''}")
    return "\n".join(lines)


def format_cluster_samples(table: pa.Table, groups: list[str], n: int = 2, width: int = 60) -> str:
    """For each named cluster of clusters.parquet: its size and its first n distinct prompts, cut to width."""
    rows = table.select(["group", "prompt"]).to_pylist()
    lines = ["what the selected clusters hold (first prompts; all in clusters.parquet):"]
    for g in groups:
        prompts = [r["prompt"] for r in rows if r["group"] == g]
        distinct = list(dict.fromkeys(prompts))[:n]
        shown = " | ".join(repr(p if len(p) <= width else p[: width - 1] + "…") for p in distinct)
        lines.append(f"  {g} ({len(prompts)} examples): {shown}")
    return "\n".join(lines)


def format_finetune(results: list[dict]) -> str:
    """Fine-tune comparison lines (validation loss on the target, lower is better)."""
    if not results:
        return "fine-tune: disabled"
    lines = ["target validation loss (lower is better), same step budget:"]
    base = next((r["base_val_loss"] for r in results if r.get("base_val_loss") is not None), None)
    if base is not None:
        lines.append(f"  {'base model (theta_0)':<34} {base:.4f}")
    for r in results:
        groups = ", ".join(r["groups"]) if r["groups"] else "-"
        lines.append(f"  {r['label']:<34} {r['val_loss']:.4f}   steps {r['steps']} "
                     f"(target {r['target_steps']}, aux {r['aux_steps']})  aux: {groups}")
    return "\n".join(lines)
