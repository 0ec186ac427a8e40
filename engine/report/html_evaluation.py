"""report.html's section on the evaluation: the verdict, each measure's table per method and k with Borda, each
method's best k, KMM's paired differences, and rho_k's tuning."""

from __future__ import annotations

import math
import statistics
from typing import Any

from convalue.engine.protocol.evaluate import label_of
from convalue.engine.protocol.measures import Measure
from convalue.engine.protocol.summaries import TARGET_LOSS
from convalue.engine.protocol.verdict import verdict_from_evaluation
from convalue.engine.report.html_markup import (
    Html,
    as_float,
    el,
    join,
    mapping,
    num,
    para,
    pm,
    section,
    table,
)
from convalue.engine.report.run_files import RunFiles
from convalue.engine.report.tables import curve_lines, tuning_table


def _cells(rows: list[dict], measure: Measure = TARGET_LOSS) -> dict[tuple[Any, Any], tuple[float, float | None]]:
    """Each (method, k) cell's value on `measure` over its seeds: (mean, sd or None)."""
    values: dict[tuple[Any, Any], list[float]] = {}
    for r in rows:
        if not math.isnan(v := as_float(measure.value(r))):
            k = r.get("k")
            k = None if k is None or as_float(k) != as_float(k) else int(k)
            values.setdefault((r.get("method"), k), []).append(v)
    return {c: (sum(v) / len(v), statistics.stdev(v) if len(v) > 1 else None) for c, v in values.items()}


def _why_no_evaluation(run: RunFiles) -> str:
    command = (run.field("data") or {}).get("command")
    if command in ("faithfulness", "transfer"):
        return (f"this folder is a `convalue {command}` analysis: its results are {command}.parquet and "
                f"{command}.png, and what `convalue {command}` printed is in summary.json under evaluation.{command}")
    if run.config("finetune").get("enabled") is False:
        return "fine-tunes were off (finetune.enabled: false), so no selection was trained and compared"
    status, stage = run.field("status"), run.field("failed_stage")
    if status == "failed":
        done = run.field("finetune_finished")
        kept = f"; {len(done)} fine-tune(s) had finished and are kept in finetunes/" if isinstance(done, list) else ""
        return f"the run failed in stage {stage or '?'} before the evaluation was complete{kept}"
    if status in ("running", "resolving"):
        return "the run has not reached the end of its fine-tunes yet"
    return "summary.json has no evaluation"


def evaluation_section(run: RunFiles) -> Html:
    ev = mapping(run.field("evaluation"))
    rows = run.field("finetune")
    rows = [r for r in rows if isinstance(r, dict)] if isinstance(rows, list) else run.rows("evaluation") or []
    if not ev or not rows:
        done = [r for r in run.field("finetune_finished") or [] if isinstance(r, dict)]
        partial = table(["fine-tune", "seed", "validation loss"],
                        [[r.get("label"), r.get("seed"), num(r.get("val_loss"))] for r in done],
                        id="finished-table") if done else None
        return section("evaluation", "The evaluation", para(f"No evaluation: {_why_no_evaluation(run)}.",
                                                             class_="missing"), partial)
    main = _main_measure(ev)
    steps = next((r.get("steps") for r in rows if r.get("steps") is not None), None)
    seeds = ev.get("seeds") or []
    over = f"; mean ± sd over the seeds {seeds}" if len(seeds) > 1 else ""
    verdict = verdict_from_evaluation(ev)
    parts: list[Any] = [
        el("p", el("strong", f"Verdict: {verdict.kind}"), f" — {verdict.sentence}", class_="answer", id="verdict"),
        _evaluations_line(run, main),
        para(f"Each table: the value after {steps if steps is not None else '?'} steps per fine-tune{over}; ★ each "
             "method's best k; Borda count over k (higher is better)."),
        el("h3", f"{_heading(main)} (finetune.select_by: best k, Borda and the verdict)"),
        *_measure_tables(rows, ev, main, main_keys=True)]
    for record in ev.get("evaluations") or []:
        record = mapping(record)
        try:
            measure = Measure(str(record.get("evaluation")), str(record.get("metric")))
        except ValueError:
            continue
        if measure != main:
            parts += [el("h3", _heading(measure)), *_measure_tables(rows, record, measure, main_keys=False)]
    tuned = tuning_table(ev)
    if tuned is not None:
        parts += [el("h3", "rho_k per budget (finetune.tune)"), para(tuned[0] + "."),
                  table(tuned[1], tuned[2], id="tuning-table")]
    tunes = mapping(ev.get("fine_tunes"))
    if tunes:
        parts.append(para(f"Fine-tunes trained: {tunes.get('trained', '?')}; read back from earlier runs: "
                          f"{tunes.get('reused', '?')}."))
    if run.field("finetune_stale"):
        parts.append(para(f"Stale: {run.field('finetune_stale')}", class_="warn"))
    parts.append(run.image("evaluation.png", "each evaluation's value against k"))
    if curves := curve_lines(ev, main.evaluation):
        parts += [el("h3", "Learning curves (finetune.eval_every)"), el("pre", "\n".join(curves)),
                  run.image("curves.png", "each cell's loss against steps")]
    return section("evaluation", "The evaluation", *parts)


def _main_measure(ev: dict) -> Measure:
    """finetune.select_by's measure as the evaluation records it (older summaries: their metric on target_val)."""
    try:
        return Measure.of_evaluation(ev)
    except ValueError:
        return TARGET_LOSS


def _heading(measure: Measure) -> str:
    """A measure as a table's heading names it, with its evaluation."""
    where = "the target's validation split" if measure.evaluation == TARGET_LOSS.evaluation else \
        f"evaluation {measure.evaluation}"
    return f"{measure.metric.capitalize()} on {where} ({measure.evaluation}; " \
           f"{'lower' if measure.lower_is_better else 'higher'} is better)"


def _evaluations_line(run: RunFiles, main: Measure) -> Html:
    """Which evaluations every fine-tune was measured on, and which one decides."""
    sets = [mapping(e) for e in mapping(run.field("data")).get("evaluations") or [] if isinstance(e, dict)]
    listed = "; ".join(f"{e.get('name')} ({e.get('source')}, {e.get('examples')} examples)" for e in sets)
    return para(f"Every fine-tune was measured on {listed or 'the target validation split (target_val)'}. "
                f"finetune.select_by {main.name} decides each method's best k, the Borda count and the verdict.")


def _measure_tables(rows: list[dict], ev: dict, measure: Measure, main_keys: bool) -> list[Html]:
    """One measure's tables: value per method and k with Borda, each method's best k, KMM's paired differences.
    main_keys: `ev` is the evaluation itself (the select_by measure: ids `evaluation-table`, `best-k-table`,
    `kmm-minus-table`), else one record of its `evaluations` (ids suffixed with the measure)."""
    suffix = "" if main_keys else f"-{measure.evaluation}-{measure.metric}"
    ks = [k for k in ev.get("ks") or [] if isinstance(k, int)]
    methods = [m for m in ev.get("methods") or [] if isinstance(m, str)]
    cells, borda = _cells(rows, measure), mapping(ev.get("borda"))
    best_k = {m: mapping(b) for m, b in mapping(ev.get("best_k")).items()}
    body = []
    for m in methods:
        star = best_k.get(m, {}).get("k")
        cell = [join(pm(*cells[m, k]), " ★" if star == k else "") if (m, k) in cells else "–" for k in ks]
        body.append([label_of(m), *cell, num(borda.get(m), "g")])
    target, base = cells.get(("target_only", None)), None
    if main_keys:
        if target is None and ev.get("target_only_value") is not None:
            target = (ev["target_only_value"], ev.get("target_only_value_sd"))
        base = ev.get("base_value", ev.get("base_val_loss") if measure == TARGET_LOSS else None)
    else:
        base = ev.get("base")
    if target is not None:
        body.append(join(el("td", "target only"), el("td", pm(*target), " (the same at every k)",
                                                      colspan=max(len(ks), 1)), el("td", "")))
    if base is not None:
        body.append(join(el("td", "base model (no fine-tune)"), el("td", num(base), colspan=max(len(ks), 1)),
                         el("td", "")))
    what = f"{measure.metric} on {measure.evaluation}"
    return [table(["method", *(f"k = {k}" for k in ks), "Borda"], body, id=f"evaluation-table{suffix}"),
            table(["method", "best k", what, "groups bought"],
                  [[label_of(m), num(b.get("k"), "d"), pm(b.get("value", b.get("val_loss")),
                                                          b.get("value_sd", b.get("val_loss_sd"))),
                    ", ".join(map(str, b.get("groups") or [])) or "–"] for m, b in best_k.items()],
                  id=f"best-k-table{suffix}"),
            _kmm_minus(ev, measure, suffix)]


def _kmm_minus(ev: dict, measure: Measure = TARGET_LOSS, suffix: str = "") -> Html:
    """KMM's value minus each method's on `measure`, with its paired 95 % interval."""
    diffs = [d for d in ev.get("kmm_minus") or [] if isinstance(d, dict)]
    if not diffs:
        return para("No paired differences (KMM was not among the methods evaluated).", class_="missing")
    lower = measure.lower_is_better
    body, classes = [], []
    for d in diffs:
        ci, mean = d.get("ci95"), as_float(d.get("mean"))
        if isinstance(ci, list) and len(ci) == 2:
            lo, hi = as_float(ci[0]), as_float(ci[1])
            verdict = "KMM lower" if hi < 0 else "KMM higher" if lo > 0 else "no clear difference (0 inside)"
            interval = join("[", num(lo, "+.4f"), ", ", num(hi, "+.4f"), "]")
        else:
            verdict = "one seed: no interval" if mean == mean else "–"
            interval = "–"
        good = "KMM lower" if lower else "KMM higher"
        bad = "KMM higher" if lower else "KMM lower"
        body.append([label_of(d.get("method")), num(d.get("k"), "d"), pm(mean, d.get("sd"), "+.4f"),
                     interval, f"{d.get('reference_lower', '?')} of {d.get('seeds', '?')}", verdict])
        classes.append("good" if verdict == good else "bad" if verdict == bad else None)
    return join(para(f"KMM's {measure.metric} on {measure.evaluation} minus each method's at each k, seed by seed "
                     "(the seeds' draws are shared, so the pairs cancel their noise): "
                     f"{'negative' if lower else 'positive'} means KMM's selection did better; an interval without 0 "
                     "is a difference at the 5% level of the paired t-test."),
                table(["method", "k", "KMM − method (mean ± sd)", "paired 95% interval", "seeds with KMM lower",
                       "verdict"], body, classes, id=f"kmm-minus-table{suffix}"))
