"""Print a finished evaluation run's main table as docs/paper-results.md shows it (paper Tab. multilingual_results):
each method's mean ± sd per k on finetune.select_by's measure with best k and Borda, then KMM's paired differences
against One-Step, random and the target alone on select_by's evaluation and on target_val, and TV + KMM against TV.

    .venv/bin/python bench/main_table.py runs/paper-main-marathi
    .venv/bin/python bench/main_table.py runs/paper-main-japanese --reference kmm

Reads only the run folder's summary.json; every number is recomputed from its fine-tune rows by the same code the
run used (engine.protocol.summaries), so the table and report.html cannot disagree."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from convalue.engine.protocol.evaluate import label_of
from convalue.engine.protocol.measures import Measure
from convalue.engine.protocol.summaries import paired_differences, summarise_measure


def diff_text(d) -> str:
    """One paired difference: mean [95 % interval], bold where the interval excludes 0."""
    if d is None:
        return "–"
    if d.ci95 is None:
        return f"{d.mean:+.4f}"
    text = f"{d.mean:+.4f} [{d.ci95[0]:+.4f}, {d.ci95[1]:+.4f}]"
    return f"**{text}**" if d.ci95[0] > 0 or d.ci95[1] < 0 else text


def table(summary: dict, reference: str) -> str:
    """The markdown tables of one run's summary."""
    ev, rows = summary["evaluation"], summary["finetune"]
    ks, main = ev["ks"], Measure.parse(ev["select_by"])
    s = summarise_measure(rows, ks, main)
    best_per_k = {k: min(s.cells[m, k].mean for m in s.methods if (m, k) in s.cells) for k in ks}
    bought = {(r["method"], r["k"]): len(r["groups"]) for r in rows if r["k"] is not None}
    out = [f"{main.words}, mean ± sd over seeds {ev['seeds']}; Borda over k = {', '.join(map(str, ks))}:", "",
           "| method | " + " | ".join(f"k = {k}" for k in ks) + " | best k | Borda |",
           "| --- |" + " --- |" * (len(ks) + 2)]
    for m in sorted(s.methods, key=lambda m: -s.borda[m]):
        cells = []
        for k in ks:
            c = s.cells[m, k]
            text = f"{c.mean:.4f} ± {c.sd:.4f}" if c.sd is not None else f"{c.mean:.4f}"
            text = f"**{text}**" if c.mean == best_per_k[k] else text
            cells.append(text + (f" ({bought[m, k]} bought)" if bought.get((m, k), k) < k else ""))
        out.append(f"| {label_of(m)} | " + " | ".join(cells) + f" | {s.best_k[m].k} | {s.borda[m]:g} |")
    if s.target_only is not None:
        t = s.target_only
        out.append(f"| target only | {t.mean:.4f}" + (f" ± {t.sd:.4f}" if t.sd is not None else "") + " |"
                   + " |" * (len(ks) + 1))
    if s.base is not None:
        out.append(f"| base model | {s.base:.4f} |" + " |" * (len(ks) + 1))
    measures = [main] + ([Measure("target_val", main.metric)] if main.evaluation != "target_val" else [])
    diffs = {ms: {(d.method, d.k): d for d in paired_differences(rows, ks, reference, ms)} for ms in measures}
    out += ["", f"{label_of(reference)} minus each, paired by seed (95 % t-interval; negative: "
            f"{label_of(reference)} better), on " + " / on ".join(ms.evaluation for ms in measures) + ":", "",
            "| against | " + " | ".join(f"k = {k}" for k in ks) + " |", "| --- |" + " --- |" * len(ks)]
    for m in [m for m in ("one_step", "cosine", "random", "target_only") if (m, ks[0]) in diffs[main]]:
        out.append(f"| {label_of(m)} | " + " | ".join(" / ".join(diff_text(diffs[ms].get((m, k))) for ms in measures)
                                                     for k in ks) + " |")
    if {"tv", "tv+kmm"} <= set(s.methods):
        tv = {ms: {d.k: d for d in paired_differences(rows, ks, "tv+kmm", ms) if d.method == "tv"}
              for ms in measures}
        out.append("| TV + KMM − TV | " + " | ".join(" / ".join(diff_text(tv[ms].get(k)) for ms in measures)
                                                     for k in ks) + " |")
    verdict = ev.get("verdict") or {}
    out += ["", f"verdict: {verdict.get('kind')} — {verdict.get('sentence')}"]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", type=Path, help="a finished run folder (its summary.json)")
    ap.add_argument("--reference", default="kmm", help="the method whose differences are shown (default kmm)")
    args = ap.parse_args(argv)
    summary = finished_summary(args.run_dir, "main_table", "evaluation", "no finished evaluation")
    if summary is None:
        return 2
    print(table(summary, args.reference))
    return 0


def finished_summary(run_dir: Path, tool: str, field: str, missing: str) -> dict | None:
    """A complete run's summary.json whose evaluation holds `field`, or None after one `TOOL: error:` line."""
    path = run_dir / "summary.json"
    try:
        summary = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        print(f"{tool}: error: {path}: {exc}", file=sys.stderr)
        return None
    evaluation = summary.get("evaluation") or {}
    if summary.get("status") != "complete" or not (evaluation if field == "evaluation" else evaluation.get(field)):
        print(f"{tool}: error: {path}: status {summary.get('status')!r}, {missing}", file=sys.stderr)
        return None
    return summary


if __name__ == "__main__":
    raise SystemExit(main())
