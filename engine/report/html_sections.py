"""report.html's building blocks: HTML primitives that escape everything not built by them (Html), and the
sections on the ranking, the selection and the evaluation (each reads the run through html.RunFiles)."""

from __future__ import annotations

import math
import statistics
from typing import Any

from convalue.engine.protocol.evaluate import label_of
from convalue.engine.protocol.measures import Measure
from convalue.engine.protocol.summaries import TARGET_LOSS
from convalue.engine.protocol.verdict import BUY, DO_NOT_BUY, NO_DIFFERENCE, verdict_from_evaluation
from convalue.engine.report.fonts import lang_of
from convalue.engine.report.html_markup import (
    Html,
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
from convalue.engine.report.tables import tuning_table

TARGET_KEY = "__target__"  # examples.parquet's group of the target (engine.data.prepare.TARGET_KEY)
RANKING_TOP, RANKING_NEGATIVE = 50, 20  # a long pool's ranking: the top 50 and the 20 most negative
EXAMPLES_SHOWN, EXAMPLE_CHARS = 3, 1200


def why_absent(run: RunFiles, what: str, stage: str) -> str:
    """Why `what` (written at or after `stage`) is not there: the run failed earlier, is unfinished, or the file
    is missing or damaged."""
    name = f"{what}.parquet"
    if name in run.problems:
        return run.problems[name]
    status, failed = run.field("status"), run.field("failed_stage")
    if status == "failed":
        return f"the run failed in stage {failed or '?'} before it wrote {name}"
    if status in ("running", "resolving"):
        return f"the run has not written {name} yet (it is unfinished)"
    return f"{name} is not in the run folder ({stage} left no {what})"


def counts_line(rows: list[dict]) -> str:
    """How many candidates help, hurt or add nothing."""
    pos = sum(1 for r in rows if _f(r.get("score")) > 0)
    neg = sum(1 for r in rows if _f(r.get("score")) < 0)
    return (f"{len(rows)} candidates: {pos} positive (help the target), {neg} negative (hurt it), "
            f"{len(rows) - pos - neg} zero (redundant or irrelevant).")


def _f(x: Any) -> float:
    """x as a float (NaN where it is not a number)."""
    try:
        return float(x)
    except (TypeError, ValueError):
        return math.nan


def shown_ranking(rows: list[dict]) -> tuple[list[dict], list[dict], int]:
    """(the top, the most negative of the rest, how many are left out): all rows for a pool of at most
    RANKING_TOP + RANKING_NEGATIVE candidates."""
    if len(rows) <= RANKING_TOP + RANKING_NEGATIVE:
        return rows, [], 0
    rest = rows[RANKING_TOP:]
    worst = sorted((r for r in rest if _f(r.get("score")) < 0), key=lambda r: _f(r.get("score")))[:RANKING_NEGATIVE]
    chosen = {id(r) for r in worst}
    tail = [r for r in rest if id(r) in chosen]  # in rank order
    return rows[:RANKING_TOP], tail, len(rest) - len(tail)


def ranking_section(run: RunFiles) -> Html:
    rows = run.rows("scores")
    legend = para("Score w (signed): positive, the group helps the model toward the target; negative, it hurts; "
                  "zero, it adds nothing the others do not already give (redundant) or does not bear on the target "
                  "(irrelevant). beta is each group's alignment with the target on its own, cosine its one-step "
                  "cosine.", class_="legend")
    if rows is None:
        lines = run.field("ranking")
        fallback = (para("summary.json's printed ranking:"), el("pre", "\n".join(map(str, lines)))) \
            if isinstance(lines, list) and lines else (None, None)
        return section("ranking", "The ranking", para(f"No ranking to show: {why_absent(run, 'scores', 'the solve')}.",
                                                       class_="missing"), *fallback)
    rows.sort(key=lambda r: (_f(r.get("rank")), str(r.get("group"))))
    boot_rows = run.rows("bootstrap")
    boot = {r["group"]: r for r in boot_rows} if boot_rows is not None else None
    top, tail, omitted = shown_ranking(rows)
    headers = ["rank", "group", "score w", "beta", "cosine", "examples", "preview", "selected"]
    if boot is not None:
        headers += ["w over resamples (mean ± sd)", "95% interval", "p(w > 0)", "p(selected)"]
    body, classes = [], []
    for r in top + tail:
        w = _f(r.get("score"))
        cells = [num(r.get("rank"), "d"), r.get("group"), "0" if w == 0 else num(w, "+.4f"), num(r.get("beta"), ".3e"),
                 num(r.get("cosine"), "+.3f"), num(r.get("n_examples"), "d"), num(r.get("n_preview"), "d"),
                 "★ selected" if r.get("selected") else ""]
        if boot is not None:
            b = boot.get(r.get("group"), {})
            cells += [pm(b.get("score_mean"), b.get("score_std"), "+.4f"),
                      join("[", num(b.get("score_q025"), "+.4f"), ", ", num(b.get("score_q975"), "+.4f"), "]")
                      if b else "–", num(b.get("p_positive"), ".0%"), num(b.get("p_selected"), ".0%")]
        body.append(cells)
        classes.append(" ".join(["cand", "pos" if w > 0 else "neg" if w < 0 else "zero"]
                                + (["sel"] if r.get("selected") else [])))
        if omitted and r is top[-1]:
            first = len(top) + 1
            body.append(el("td", f"… {omitted} candidates omitted (of ranks {first}–{len(rows)}, only the "
                                 f"{len(tail)} most negative are shown); every candidate is in scores.parquet",
                           colspan=len(headers)))
            classes.append("omitted")
    shown = para(f"Showing the top {len(top)} and the {len(tail)} most negative; {omitted} omitted.") \
        if omitted else None
    return section("ranking", "The ranking", para(counts_line(rows)), legend, shown,
                   el("div", table(headers, body, classes, id="ranking-table"), class_="wide"),
                   bootstrap_note(run, boot is not None), run.image("scores.png", "KMM scores by rank"))


def bootstrap_note(run: RunFiles, have_table: bool) -> Html:
    """The bootstrap's stability line, or why there is none."""
    stats = mapping(run.field("bootstrap"))
    if stats:
        freq = ", ".join(f"{g} {_f(p):.0%}" for g, p in mapping(stats.get("p_selected")).items()) or "–"
        line = (f"Bootstrap over the previews ({stats.get('samples', '?')} resamples): the same selection came out "
                f"in {_f(stats.get('same_selection')):.0%} of them; how often each selected group was chosen: {freq}.")
        return para(line + ("" if have_table else " (bootstrap.parquet is not there: no per-group spread.)"))
    if have_table:
        return para("Confidence columns: bootstrap.parquet (summary.json has no bootstrap summary).")
    samples = run.config("bootstrap").get("samples")
    if "bootstrap.parquet" in run.problems:
        return para(run.problems["bootstrap.parquet"], class_="missing")
    if samples:
        return para(f"No confidence columns: {why_absent(run, 'bootstrap', 'the bootstrap')}.", class_="missing")
    return para("No confidence columns: the bootstrap was off (bootstrap.samples is 0); set bootstrap.samples and "
                "features.keep_per_example to see how stable the selection is.", class_="missing")


def _cut(text: Any) -> str:
    s = "" if text is None else str(text)
    return s if len(s) <= EXAMPLE_CHARS else s[:EXAMPLE_CHARS] + f" … (cut; {len(s)} characters in all)"


def examples_block(rows: list[dict]) -> Html:
    """A few prompt/response pairs (their text marked with the language of a group named after one)."""
    def one(r: dict) -> Html:
        lang = lang_of(r.get("source_group") or r.get("group"))
        return el("div", el("div", "prompt" + (f" (from {r['source_group']})" if r.get("source_group") else ""),
                            class_="role"), el("div", _cut(r.get("prompt")), class_="txt", lang=lang),
                  el("div", "response", class_="role"), el("div", _cut(r.get("response")), class_="txt", lang=lang),
                  class_="ex")

    return join(*(one(r) for r in rows[:EXAMPLES_SHOWN]))


def group_examples(run: RunFiles, groups: list[str]) -> dict[str, Html]:
    """Each group's first examples from examples.parquet, else from clusters.parquet (a flat pool's), or why there
    are none; each table read once, for the rows of `groups` only."""
    found: dict[str, list[dict]] = {}
    t = run.table("examples", groups)
    for r in t.to_pylist() if t is not None else []:
        found.setdefault(r["group"], []).append(r)
    rest = [g for g in groups if g not in found]
    c = run.table("clusters", rest) if rest else None
    pooled: dict[str, list[dict]] = {}
    for r in c.to_pylist() if c is not None else []:
        pooled.setdefault(r["group"], []).append(r)
    why = run.problems.get("examples.parquet") or ("examples.parquet has no rows of this group" if t is not None
                                                   else "examples.parquet is not in the run folder")
    out = {}
    for g in groups:
        if g in found:
            out[g] = examples_block(found[g])
        elif g in pooled:
            sources: dict[str, int] = {}
            for r in pooled[g]:
                sources[str(r.get("source_group"))] = sources.get(str(r.get("source_group")), 0) + 1
            held = ", ".join(f"{s} ({n})" for s, n in sorted(sources.items(), key=lambda x: -x[1])[:5])
            out[g] = join(para(f"A cluster of {len(pooled[g])} pooled examples, from: {held}."),
                          examples_block(pooled[g]))
        else:
            out[g] = para(f"No examples to show: {why}.", class_="missing")
    return out


def answer_text(run: RunFiles) -> str | None:
    """report.html's opening line: what to train on, as the run's verdict (engine.protocol.verdict) has it, so the
    page never recommends a purchase its own evaluation contradicts (None before there is a selection)."""
    selected = run.field("selected")
    if not isinstance(selected, list):
        return None
    target = mapping(run.field("data")).get("target") or "the target task"
    picks = ", ".join(map(str, selected))
    verdict = verdict_from_evaluation(run.field("evaluation"))
    if verdict.kind == BUY:
        return f"Train on {', '.join(verdict.groups)} together with {target}'s own data: {verdict.sentence}"
    if verdict.kind == DO_NOT_BUY:
        return f"Train on {target}'s own data alone: {verdict.sentence}"
    if verdict.kind == NO_DIFFERENCE:
        return (f"No resolvable difference: {verdict.sentence} KMM's ranking, taken alone, puts "
                f"{picks or 'no candidate'} first.")
    if not selected:
        return f"No candidate scored positive: train on {target}'s own data alone. Not evaluated: {verdict.sentence}"
    return f"KMM would buy {picks} for {target}. Not evaluated: {verdict.sentence}"


def selection_section(run: RunFiles) -> Html:
    selected = run.field("selected")
    scores = {r.get("group"): r for r in run.rows("scores") or []}
    if not isinstance(selected, list):
        selected = [g for g, r in sorted(scores.items(), key=lambda x: _f(x[1].get("rank"))) if r.get("selected")]
    selected = [str(g) for g in selected]
    examples = group_examples(run, [*selected, TARGET_KEY])
    target = mapping(run.field("data")).get("target")
    target_part = (el("h3", "The target" + (f": {target}" if target else "")), examples[TARGET_KEY])
    if run.field("selected") is None and not scores:
        return section("selection", "The selection", para(
            f"No selection yet: {why_absent(run, 'scores', 'the solve')}.", class_="missing"), *target_part)
    k = run.config("select").get("k")
    parts: list[Any] = [para(f"Selected: the (at most) {k if k is not None else 'k'} highest-scoring candidates "
                             "with a positive score: " + (", ".join(selected) if selected else "none") + ".")]
    if not selected:
        parts.append(para("No candidate has a positive score: by KMM, none of them helps the target beyond what "
                          "it already gives; train on the target alone."))
    for g in selected:
        r = scores.get(g, {})
        facts = f" (score w {num(r.get('score'), '+.4f')}, {num(r.get('n_examples'), 'd')} examples)" if r else ""
        parts += [el("h3", g, facts, class_="group"), examples[g]]
    parts += [leakage_line(run), *target_part]
    return section("selection", "The selection", *parts)


def leakage_line(run: RunFiles) -> Html:
    """What the leakage check dropped from the candidates before valuation (summary.json's data.leakage)."""
    leak = mapping(mapping(run.field("data")).get("leakage"))
    if not leak:
        return para("No leakage check is recorded for this run (candidate examples equal to target or evaluation "
                    "examples were not looked for).", class_="missing")
    against = ", ".join(map(str, leak.get("against") or [])) or "?"
    groups = [mapping(g) for g in leak.get("groups") or []]
    if not groups:
        return el("p", f"Leakage check: none of the {leak.get('checked', '?')} candidate examples equals an example "
                  f"of {against} (compared casefolded, Unicode NFKC, whitespace collapsed).", id="leakage")
    each = ", ".join(f"{g.get('group')} {g.get('dropped')} of {g.get('examples')}" + (" (dropped whole)"
                                                                                    if g.get("removed") else "")
                     for g in groups[:20]) + (f", and {len(groups) - 20} more" if len(groups) > 20 else "")
    return el("p", el("strong", "Leakage check: "), f"{leak.get('dropped', '?')} of the {leak.get('checked', '?')} "
              f"candidate examples equal an example of {against} (casefolded, NFKC, whitespace collapsed) and were "
              f"dropped before valuation: {each}.", class_="warn", id="leakage")


def _cells(rows: list[dict], measure: Measure = TARGET_LOSS) -> dict[tuple[Any, Any], tuple[float, float | None]]:
    """Each (method, k) cell's value on `measure` over its seeds: (mean, sd or None)."""
    values: dict[tuple[Any, Any], list[float]] = {}
    for r in rows:
        if not math.isnan(v := _f(measure.value(r))):
            k = r.get("k")
            values.setdefault((r.get("method"), None if k is None or _f(k) != _f(k) else int(k)), []).append(v)
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
    return section("evaluation", "The evaluation", *parts)


def _main_measure(ev: dict) -> Measure:
    """finetune.select_by's measure as the evaluation records it (older summaries: their metric on target_val)."""
    try:
        return Measure.parse(str(ev.get("select_by") or ev.get("metric") or "loss"))
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
        ci, mean = d.get("ci95"), _f(d.get("mean"))
        if isinstance(ci, list) and len(ci) == 2:
            lo, hi = _f(ci[0]), _f(ci[1])
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
