"""Print a run's learning curves (finetune.eval_every) as markdown tables: per evaluation, each cell's mean loss
over its seeds at every measured step (bold: the cell's lowest), and the reference method's loss minus the target
alone's at each step where both measured it, paired by seed with its 95 % t-interval. Then every cell stopped at
its own best step, the lowest of its mean curve on one evaluation (`--choose-on`, default target_val), read on
every evaluation there: the comparison of a user who tunes the number of steps on data they hold out.

    .venv/bin/python bench/curve_table.py runs/regime-curves-n6

Reads only the run folder's summary.json: the rows' curves, paired seed by seed by the run's own code
(engine.protocol.summaries)."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from main_table import diff_text, finished_summary  # bench/main_table.py, beside this script

from convalue.engine.protocol.curves import cell_curves, cell_label
from convalue.engine.protocol.evaluate import label_of
from convalue.engine.protocol.measures import Measure
from convalue.engine.protocol.summaries import PairedDifference, mean_sd, paired_differences
from convalue.engine.store.finetunes import curve_is_valid


def point_row(row: dict, step: int, losses: dict[str, float]) -> dict:
    """A bare protocol row of `row` as it stood at `step`, holding only `losses` (target_val's in `val_loss`, where
    Measure reads it; every other evaluation's in `evaluations`)."""
    return {"method": row["method"], "k": row.get("k"), "seed": row.get("seed"), "step": step,
            "val_loss": losses.get("target_val"), "evaluations": {n: {"loss": v} for n, v in losses.items()}}


def at_step(rows: list[dict], step: int, evaluation: str, methods: set[str]) -> list[dict]:
    """The rows of `methods` as they stood at `step`, holding only their loss on `evaluation` there (rows that did
    not measure the step left out)."""
    out = []
    for r in rows:
        point = next((p for p in r.get("curve") or [] if p["step"] == step), None)
        if r["method"] in methods and point is not None and point["losses"].get(evaluation) is not None:
            out.append(point_row(r, step, {evaluation: point["losses"][evaluation]}))
    return out


def paired_at_each_k(rows: list[dict], ks: list[int], reference: str, measure: Measure) -> list[PairedDifference]:
    """paired_differences k by k over the cells present at each (a method not run at some k, or without the
    measure there, is left out of that k instead of failing the table)."""
    out = []
    for k in ks:
        there = [r for r in rows if (r["k"] == k or r["method"] == "target_only") and measure.value(r) is not None]
        if any((r["method"], r["k"]) == (reference, k) for r in there):
            out += paired_differences(there, [k], reference, measure)
    return out


def table(summary: dict, reference: str) -> str:
    """The markdown tables of one run's curves, select_by's evaluation first."""
    rows, ev = summary["finetune"], summary["evaluation"]
    main = Measure.of_evaluation(ev).evaluation
    names = sorted({p_name for r in rows for p in r.get("curve") or [] for p_name in p["losses"]},
                   key=lambda n: (n != main, n))
    out = []
    for name in names:
        curves = cell_curves(rows, [name])
        steps = sorted({s for c in curves for s in c.steps})
        head = [c.label for c in curves]
        ks = sorted({c.k for c in curves if c.method == reference and c.k is not None})
        out += [f"loss on {name}, mean over seeds at each step (bold: each cell's lowest); {label_of(reference)} minus the "
                "target alone, paired by seed (95 % t-interval; negative: the selection better):", "",
                "| step | " + " | ".join(head) + "".join(f" | {cell_label(reference, k)} − target only" for k in ks)
                + " |",
                "| --- |" + " --- |" * (len(head) + len(ks))]
        for s in steps:
            cells = []
            for c in curves:
                v = c.mean[c.steps.index(s)] if s in c.steps else None
                cells.append("–" if v is None else f"**{v:.4f}**" if s == c.best_step else f"{v:.4f}")
            there = at_step(rows, s, name, {reference, "target_only"})
            diffs = {d.k: d for d in paired_at_each_k(there, ks, reference, Measure(name, "loss"))}
            out.append(f"| {s} | " + " | ".join(cells)
                       + "".join(f" | {diff_text(diffs[k]) if k in diffs else '–'}" for k in ks) + " |")
        out.append("")
    return "\n".join(out).rstrip()


def stopped_at_best(rows: list[dict], choose_on: str) -> list[dict]:
    """Every fine-tune of a cell read at the cell's best step: the lowest point of its mean `choose_on` curve over
    the seeds (one step per cell, as the paper tunes the steps per budget). Bare rows with that `step`, each
    seed's own lowest `choose_on` step (`own_step`, for the record) and every evaluation's loss at the step."""
    best = {(c.method, c.k): c.best_step for c in cell_curves(rows, [choose_on])}
    out = []
    for r in rows:
        step = best.get((r["method"], r.get("k")))
        if step is None or not curve_is_valid(r.get("curve")):
            continue
        points = [p for p in r["curve"] if math.isfinite(p["losses"].get(choose_on, math.nan))]
        there = next((p for p in points if p["step"] == step), None)
        if there is None:
            continue
        own = min(points, key=lambda p: (p["losses"][choose_on], p["step"]))["step"]
        finite = {n: v for n, v in there["losses"].items() if math.isfinite(v)}
        out.append(point_row(r, step, finite) | {"own_step": own})
    return out


def best_step_table(summary: dict, reference: str, choose_on: str) -> str:
    """Every cell stopped at its best `choose_on` step: the step, the mean loss there on each evaluation, and the
    reference minus every other cell, paired by seed."""
    best = stopped_at_best(summary["finetune"], choose_on)
    if not best:
        return f"(no curve measured {choose_on}: no step to choose)"
    main = Measure.of_evaluation(summary["evaluation"]).evaluation
    names = sorted({n for r in best for n in r["evaluations"]}, key=lambda n: (n != main, n != choose_on, n))
    cells: dict[tuple, list[dict]] = {}
    for r in best:
        cells.setdefault((r["method"], r["k"]), []).append(r)
    out = [f"each cell stopped at the lowest step of its mean {choose_on} curve, read there on every evaluation "
           "(mean over seeds; in brackets each seed's own lowest step):", "",
           "| cell | step (by seed) | " + " | ".join(names) + " |", "| --- | --- |" + " --- |" * len(names)]
    for (m, k), rs in cells.items():
        rs = sorted(rs, key=lambda r: (r["seed"] is None, r["seed"]))
        means = [mean_sd([r["evaluations"][n]["loss"] for r in rs if n in r["evaluations"]] or [float("nan")])[0]
                 for n in names]
        out.append(f"| {cell_label(m, k)} | {rs[0]['step']} (" + ", ".join(str(r["own_step"]) for r in rs) + ") | "
                   + " | ".join(f"{v:.4f}" for v in means) + " |")
    ks = sorted({k for m, k in cells if m == reference and k is not None})
    diffs = {n: {(d.method, d.k): d for d in paired_at_each_k(best, ks, reference, Measure(n, "loss"))}
             for n in names}
    pairs = list(dict.fromkeys(key for n in names for key in diffs[n]))
    if pairs:
        out += ["", f"{label_of(reference)} minus each, both at their cells' steps, paired by seed (95 % "
                "t-interval; negative: the reference better):", "",
                "| against | " + " | ".join(names) + " |", "| --- |" + " --- |" * len(names)]
        for m, k in pairs:
            against = cell_label(m, None if m == "target_only" else k)
            out.append(f"| {cell_label(reference, k)} − {against} | "
                       + " | ".join(diff_text(diffs[n].get((m, k))) for n in names) + " |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", type=Path, help="a finished run folder with learning curves (finetune.eval_every)")
    ap.add_argument("--reference", default="kmm", help="the method compared with the target alone (default kmm)")
    ap.add_argument("--choose-on", default="target_val",
                    help="the evaluation each fine-tune's best step is chosen on (default target_val)")
    args = ap.parse_args(argv)
    summary = finished_summary(args.run_dir, "curve_table", "curves",
                               "no learning curves (run with finetune.eval_every)")
    if summary is None:
        return 2
    print(table(summary, args.reference))
    print()
    print(best_step_table(summary, args.reference, args.choose_on))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
