"""report.html's sections on the ranking and the selection (each reads the run through RunFiles); the evaluation's
is in html_evaluation."""

from __future__ import annotations

from typing import Any

from convalue.engine.protocol.verdict import BUY, DO_NOT_BUY, NO_DIFFERENCE, verdict_from_evaluation
from convalue.engine.report.fonts import lang_of
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
    pos = sum(1 for r in rows if as_float(r.get("score")) > 0)
    neg = sum(1 for r in rows if as_float(r.get("score")) < 0)
    return (f"{len(rows)} candidates: {pos} positive (help the target), {neg} negative (hurt it), "
            f"{len(rows) - pos - neg} zero (redundant or irrelevant).")


def shown_ranking(rows: list[dict]) -> tuple[list[dict], list[dict], int]:
    """(the top, the most negative of the rest, how many are left out): all rows for a pool of at most
    RANKING_TOP + RANKING_NEGATIVE candidates."""
    if len(rows) <= RANKING_TOP + RANKING_NEGATIVE:
        return rows, [], 0
    rest = rows[RANKING_TOP:]
    negative = (r for r in rest if as_float(r.get("score")) < 0)
    worst = sorted(negative, key=lambda r: as_float(r.get("score")))[:RANKING_NEGATIVE]
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
    rows.sort(key=lambda r: (as_float(r.get("rank")), str(r.get("group"))))
    boot_rows = run.rows("bootstrap")
    boot = {r["group"]: r for r in boot_rows} if boot_rows is not None else None
    top, tail, omitted = shown_ranking(rows)
    headers = ["rank", "group", "score w", "beta", "cosine", "examples", "preview", "selected"]
    if boot is not None:
        headers += ["w over resamples (mean ± sd)", "95% interval", "p(w > 0)", "p(selected)"]
    body, classes = [], []
    for r in top + tail:
        w = as_float(r.get("score"))
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
        freq = ", ".join(f"{g} {as_float(p):.0%}" for g, p in mapping(stats.get("p_selected")).items()) or "–"
        line = (f"Bootstrap over the previews ({stats.get('samples', '?')} resamples): the same selection came out "
                f"in {as_float(stats.get('same_selection')):.0%} of them; how often each selected group was chosen: {freq}.")
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
        selected = [g for g, r in sorted(scores.items(), key=lambda x: as_float(x[1].get("rank"))) if r.get("selected")]
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
