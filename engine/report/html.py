"""report.html: one self-contained page (inline CSS, PNGs as data URIs, no script) that answers "which candidate
datasets should I train on for my target task?" from a run folder, read defensively: a missing or damaged file or
field is a sentence in the page, never an error, and every text from the run is escaped."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from convalue.engine.files.errors import StoreError
from convalue.engine.files.folder import RunFolder, as_folder
from convalue.engine.report.fonts import FONTS, LANG_RULES
from convalue.engine.report.html_evaluation import evaluation_section
from convalue.engine.report.html_markup import (
    Html,
    el,
    join,
    keyvalue,
    mapping,
    num,
    para,
    section,
    table,
)
from convalue.engine.report.html_sections import answer_text, ranking_section, selection_section
from convalue.engine.report.run_files import RunFiles
from convalue.engine.report.run_words import gram_pairs, source_words
from convalue.engine.report.tables import tuned_before_failure
from convalue.engine.store.summary import RunSummary

REPORT = "report.html"
CSS = "\nbody{font:15px/1.45 " + FONTS + """;color:#1d2327;max-width:1200px;
margin:0 auto;padding:1.2em 1.5em 4em}
h1{font-size:1.6em;margin:.2em 0}h2{border-bottom:2px solid #dde3e8;padding-bottom:.2em;margin-top:2em}
h3{margin:1.2em 0 .4em}nav a{margin-right:1em}code,pre{font-family:ui-monospace,Menlo,Consolas,monospace}
table{border-collapse:collapse;margin:.6em 0;font-size:.92em}th,td{border:1px solid #d5dbe0;padding:.25em .6em;
text-align:left;vertical-align:top}thead th{background:#eef2f5}table.kv th{background:#f6f8fa;font-weight:600}
td{font-variant-numeric:tabular-nums}.wide{overflow-x:auto}
tr.pos td:nth-child(3){color:#1f7a6f;font-weight:600}tr.neg td:nth-child(3){color:#b5452a}
tr.zero td:nth-child(3){color:#777}tr.sel{background:#eef8f6}tr.omitted td{text-align:center;color:#555;
font-style:italic;background:#fafafa}tr.good{background:#eef8f6}tr.bad{background:#fbeeea}
.banner{padding:.8em 1em;border-radius:6px;margin:1em 0;border:2px solid}.ok{background:#eef8f6;border-color:#2a9d8f}
.failed{background:#fdecea;border-color:#c0392b;font-size:1.1em}.running{background:#fff6e0;border-color:#e0a800}
.warn{background:#fff6e0;border-left:4px solid #e0a800;padding:.4em .8em}.missing{color:#666;font-style:italic}
.answer{background:#f3f6fa;border-left:4px solid #2a6f9d;padding:.6em 1em}
.ex{border:1px solid #dde3e8;border-radius:4px;margin:.5em 0;padding:.4em .7em;background:#fbfcfd}
.role{font-size:.8em;color:#667;text-transform:uppercase;letter-spacing:.04em;margin-top:.3em}
.txt{white-space:pre-wrap;overflow-wrap:anywhere;unicode-bidi:plaintext;text-align:start}
img{max-width:100%;height:auto}figure{margin:1em 0}
figcaption{font-size:.85em;color:#666}pre{background:#f6f8fa;padding:.6em;overflow-x:auto;font-size:.85em}
""" + LANG_RULES + "\n"
NAV = (("question", "The question"), ("ranking", "Ranking"), ("selection", "Selection"), ("evaluation", "Evaluation"),
       ("certificate", "Certificate"), ("cost", "Cost"), ("provenance", "Provenance"))


def write_report(run_dir: RunFolder | Path | str) -> Path | str:
    """Write <run_dir>/report.html atomically and return its path (a local folder's Path, else the file's URI);
    FileNotFoundError for a folder without a summary.json (not a run folder). A summary.json that cannot be read
    still gives a report of what is there."""
    return write_report_noting(run_dir)[0]


def write_report_noting(run_dir: RunFolder | Path | str) -> tuple[Path | str, list[str]]:
    """write_report, and the folder's files that could not be used (summary.json or a result file), each with why."""
    folder = as_folder(run_dir)
    if not folder.is_file("summary.json"):
        raise FileNotFoundError(f"{run_dir}: not a run folder (no summary.json)")
    run = load_run(folder)
    folder.write_text(REPORT, _render(run))
    problems = [f"summary.json: {run.summary_problem}"] if run.summary_problem else []
    return folder.local / REPORT if folder.local is not None else folder / REPORT, problems + list(run.problems.values())


def render_report(run_dir: RunFolder | Path | str) -> str:
    """The report of the run folder `run_dir` (a local path, a filesystem URI or a RunFolder) as one HTML page."""
    return _render(load_run(as_folder(run_dir)))


def _render(run: RunFiles) -> str:
    name = run.summary.config.get("name") if run.summary is not None and isinstance(run.summary.config, dict) else None
    title = f"convalue report: {name or str(run.folder).rstrip('/').rsplit('/', 1)[-1]}"
    parts = [_guarded(build, run) for build in (answer, question_section, ranking_section, selection_section,
                                                  evaluation_section, certificate_section, cost_section,
                                                  provenance_section)]
    parts.insert(0, status_banner(run))  # after the sections: they note the files they could not use
    if run.problems:
        parts.insert(1, el("div", el("strong", "Files that could not be used: "),
                           el("ul", *(el("li", p) for p in run.problems.values())), class_="warn"))
    nav = el("nav", *(el("a", text, href=f"#{ident}") for ident, text in NAV))
    body = join(el("h1", title), para("Which candidate datasets to train on for the target task, as valued by "
                                      "KMM in the run folder ", el("code", str(run.folder)), "."), nav, *parts)
    return ("<!DOCTYPE html>\n" + el("html", el("head", Html('<meta charset="utf-8">'),
                                                 Html('<meta name="viewport" content="width=device-width">'),
                                                 el("title", title), el("style", Html(CSS))),
                                      el("body", body), lang="en") + "\n")


def _guarded(build, run: RunFiles) -> Html:
    """A section, or a sentence saying why it could not be drawn (a field of an unexpected shape)."""
    try:
        return build(run)
    except Exception as exc:  # the rest of the report stands without this section
        return para(f"This part of the report could not be drawn ({build.__name__}: {type(exc).__name__}: {exc}).",
                    class_="warn")


def load_run(run_dir: RunFolder) -> RunFiles:
    """The run folder with its summary (a damaged one read field by field, keeping those of the right shape)."""
    try:
        return RunFiles(run_dir, RunSummary.read(run_dir))
    except FileNotFoundError:
        return RunFiles(run_dir, None, "there is no summary.json in the folder")
    except (StoreError, OSError, ValueError) as exc:
        strict = str(exc)
    try:
        data = json.loads(run_dir.read_text("summary.json"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return RunFiles(run_dir, None, strict)
    if not isinstance(data, dict):
        return RunFiles(run_dir, None, strict)
    kept = {"status": data["status"] if isinstance(data.get("status"), str) else "unknown"}
    for key, value in data.items():
        try:
            RunSummary.from_dict({"status": "complete", key: value})
            kept[key] = value
        except (StoreError, TypeError, ValueError):
            pass
    if kept["status"] == "resolving" and "resolving" not in kept:
        kept["status"] = "unknown"
    dropped = sorted(set(data) - set(kept))
    try:
        summary = RunSummary.from_dict(kept)
    except (StoreError, TypeError):
        return RunFiles(run_dir, None, strict)
    return RunFiles(run_dir, summary, f"{strict}; shown without the field(s) {dropped}" if dropped else strict)


def status_banner(run: RunFiles) -> Html:
    """The run's state at the top: prominent when it failed or has not finished."""
    s = run.summary
    if s is None:
        return el("div", el("strong", "No readable summary.json: "), run.summary_problem or "?",
                  ". What the folder holds is shown below.", class_="banner failed", id="status")
    notes = [para(f"summary.json was damaged: {run.summary_problem}.")] if run.summary_problem else []
    if s.finetune_stale:
        notes.append(para(f"The evaluation below is stale: {s.finetune_stale}"))
    if s.status == "failed":
        why = [el("strong", "This run FAILED"), " in stage ", el("code", s.failed_stage or "?"), ": ",
               el("span", s.error or "no error recorded", class_="error"), "."]
        if s.signal:
            why.append(f" It was stopped by {s.signal}.")
        if s.finetune_finished:
            why.append(f" {len(s.finetune_finished)} fine-tune(s) finished before the failure (kept in finetunes/).")
        if s.finetune_tuning:
            why.append(f" {tuned_before_failure(s.finetune_tuning)}.")
        return el("div", *why, para("Only what the run wrote before it failed is shown below."), *notes,
                  class_="banner failed", id="status")
    if s.status in ("running", "resolving"):
        what = "run" if s.status == "running" else "re-solve (convalue solve)"
        live = _live(run.folder)
        state = ("a process holds the folder now: it is still going" if live else
                 "no process holds the folder: it was stopped or its machine went down" if live is False else
                 "convalue status RUN_DIR tells whether it is still going")
        stage = next((k for k, p in mapping(s.progress).items()
                      if isinstance(p, dict) and p.get("total") and p.get("done") != p.get("total")), None)
        return el("div", el("strong", f"This {what} has not finished"), f" (summary.json says {s.status!r}; {state}).",
                  f" Unfinished stage: {stage}." if stage else "", para("What exists so far is shown below."),
                  *notes, class_="banner running", id="status")
    if s.status != "complete":
        return el("div", el("strong", f"Unknown run status {s.status!r}"), ": what exists is shown below.", *notes,
                  class_="banner running", id="status")
    extra = " Its scores come from a re-solve (convalue solve)." if s.resolved else ""
    head = ("Run complete." if not run.problems else
            f"Run complete, but {len(run.problems)} of its files cannot be used (listed below).")
    return el("div", el("strong", head), extra, *notes, class_="banner ok" if not notes and not run.problems else
              "banner running", id="status")


def _live(folder: RunFolder) -> bool | None:
    """Whether a process holds the run folder's lock or lease (None where that cannot be told)."""
    try:
        return folder.held()
    except Exception:  # a read-only folder, a file system without flock
        return None


def answer(run: RunFiles) -> Html | None:
    """The answer in one paragraph: what to train on, as the run's verdict says (html_sections.answer_text)."""
    text = answer_text(run)
    return None if text is None else el("div", el("strong", "In short: "), text, class_="answer", id="answer")


def _solver_form(run: RunFiles) -> str:
    cfg, rec = run.config("solver"), run.field("solver")
    form = getattr(rec, "form", None) or ("budget" if cfg.get("budget") is not None else "penalised")
    gamma = getattr(rec, "gamma", None) if rec else cfg.get("gamma")
    budget = getattr(rec, "budget", None) if rec else cfg.get("budget")
    what = f"gamma = {gamma:g}" if isinstance(gamma, (int, float)) else f"budget = {budget}"
    ratio = (rec.info.get("gamma_ratio") if rec and isinstance(rec.info, dict) else None) or cfg.get("gamma_ratio")
    ratio_text = f", gamma_ratio = {ratio:g}" if isinstance(ratio, (int, float)) else ""
    normalize = getattr(rec, "normalize", None) or cfg.get("normalize")
    return f"{form} ({what}{ratio_text}; normalize = {normalize}; method {cfg.get('method', '?')})"


def question_section(run: RunFiles) -> Html:
    data, model, feats = mapping(run.field("data")), mapping(run.field("model")), run.config("features")
    target_cfg = mapping(run.config("data").get("target"))
    sources = [mapping(c) for c in run.config("data").get("candidates") or []]
    clusters = mapping(data.get("clusters"))
    n = data.get("candidates") or (len(run.field("order")) if isinstance(run.field("order"), list) else None)
    proj = run.config("projection")
    metric = mapping(run.field("metric"))
    pairs = [
        ("target task", f"{data.get('target') or target_cfg.get('path') or '?'} ({data.get('target_train', '?')} "
                        f"training, {data.get('target_val', '?')} validation, {data.get('target_preview', '?')} "
                        "preview examples)"),
        ("candidates", f"{n if n is not None else '?'} groups from " + ("; ".join(map(source_words, sources))
                                                                        or "?")),
        ("flat pool", f"{clusters.get('examples')} examples in {clusters.get('groups')} clusters of "
                      f"{clusters.get('smallest')}–{clusters.get('largest')}" if clusters else None),
        ("model", f"{model.get('source') or run.config('model').get('source') or '?'}"
                  + (f" (digest {str(model['digest'])[:12]})" if model.get("digest") else "")),
        ("representation", f"{feats.get('representation', '?')} gradients of the {feats.get('parameters', '?')} "
                           f"parameters, projected by {proj.get('kind', '?')} to {proj.get('dim', '?')} dimensions"),
        ("metric", f"{feats.get('metric', '?')}" + (f" (support {metric.get('support')}, max/mean "
                                                    f"{metric.get('max_over_mean')})" if metric else "")),
        ("solver", _solver_form(run) + (f", solved in {run.field('space')} space" if run.field("space") else "")),
        ("k (groups to select)", run.config("select").get("k", "?")),
    ]
    return section("question", "The question", para("Which of the candidate datasets, added to the target's own "
                                                    "data, move the model toward the target task?"),
                   keyvalue(pairs, id="question-table"))


def certificate_section(run: RunFiles) -> Html:
    rec = run.field("solver")
    if rec is None:
        return section("certificate", "The solver certificate", para(
            "No certificate: the run did not finish the solve" + (f" (it failed in {run.field('failed_stage')})"
                                                                  if run.field("failed_stage") else "") + ".",
            class_="missing"))
    n = len(run.field("order")) if isinstance(run.field("order"), list) else None
    pairs = [("method", rec.method), ("form", rec.form), ("status", rec.status),
             ("KKT violation", join(num(rec.kkt, ".2e"), " (largest violation of the optimality conditions; "
                                                         "0 is exact)")),
             ("objective", num(rec.objective, ".6g")), ("iterations", num(rec.iterations, "d")),
             ("time", join(num(rec.time_s, ".3g"), " s")),
             ("nnz (non-zero scores)", f"{rec.nnz}" + (f" of {n}" if n else "")), ("l1 of w", num(rec.l1, ".4g")),
             ("normalize", rec.normalize), ("rank bound", rec.rank_bound)]
    pairs += [(str(k), json.dumps(v, default=str)) for k, v in mapping(rec.info).items()]
    warn = None if rec.status in ("optimal", "solved") else para(f"The solver's status is {rec.status!r}: the "
                                                                 "scores may not be exact.", class_="warn")
    return section("certificate", "The solver certificate", warn, keyvalue(pairs, id="certificate-table"))


def cost_section(run: RunFiles) -> Html:
    timings, progress = mapping(run.field("timings_s")), mapping(run.field("progress"))
    total = timings.get("total")
    rows = []
    for stage in dict.fromkeys([*timings, *progress]):
        p = mapping(progress.get(stage))
        share = (num(100 * timings[stage] / total, ".0f") + "%" if isinstance(total, (int, float)) and total > 0
                 and isinstance(timings.get(stage), (int, float)) and stage != "total" else "")
        done = f"{p.get('done')} of {p['total']}" if p.get("total") else ""
        # a stage the timer does not know (rho_k's tuning, inside the fine-tunes): its own time, where timings hold
        seconds = timings.get(stage, p.get("seconds") if timings else None)
        rows.append([stage, num(seconds, ".1f"), share, done])
    parts: list[Any] = [table(["stage", "seconds", "share", "work items done"], rows, id="timings-table")
                        if rows else para("No timings recorded.", class_="missing")]
    f = mapping(run.field("featurize"))
    if f:
        parts.append(keyvalue([("tokens featurised", num(f.get("tokens"), ",.0f")),
                               ("tokens per second", num(f.get("tokens_per_second"), ",.1f")),
                               ("groups computed / read back", f"{f.get('groups_computed', '?')} / "
                                                               f"{f.get('groups_reused', '?')}"),
                               ("workers", f.get("workers")), ("wall seconds", num(f.get("wall_seconds"), ".1f")),
                               ("dimensions", f"{f.get('dim_in', '?')} → {f.get('dim_out', '?')}")],
                              id="featurize-table"))
    recovered = mapping(run.field("recovered"))
    if recovered:
        items = [el("li", f"{stage}: " + ", ".join(f"{k} {json.dumps(v, default=str)}" for k, v in mapping(r).items()))
                 for stage, r in recovered.items()]
        parts.append(el("div", el("strong", "Faults the run recovered from (its results are complete):"),
                        el("ul", *items), class_="warn", id="recovered"))
    else:
        parts.append(para("No recovered faults: no retries, worker restarts or damaged vector blocks."))
    gram = mapping(run.field("gram"))
    if gram:
        parts.append(el("h3", "The Gram stage"))
        parts.append(keyvalue(gram_pairs(gram), id="gram-table"))
    warnings = mapping(run.field("data")).get("warnings")
    if isinstance(warnings, list) and warnings:
        parts.append(el("div", el("strong", "Data warnings:"), el("ul", *(el("li", w) for w in warnings)),
                        class_="warn", id="warnings"))
    else:
        parts.append(para("No data warnings."))
    return section("cost", "What it cost", *parts)


def provenance_section(run: RunFiles) -> Html:
    packages = mapping(run.field("packages"))
    try:
        files = [(n, run.folder.size(n)) for n in run.folder.names() if n != REPORT and not n.endswith(".tmp")]
    except OSError as exc:
        files = [(f"(the folder cannot be listed: {exc})", None)]
    parts: list[Any] = [
        table(["package", "version"], [[k, v if v is not None else "not installed"] for k, v in packages.items()],
              id="packages-table") if packages else para("No package versions recorded.", class_="missing"),
        para(f"Attempt id (the tag of the run's Ray metrics): {run.field('attempt')}.")
        if run.field("attempt") else None,
        el("h3", "Files in the run folder"),
        table(["file", "bytes"], [[n, num(size, ",d")] for n, size in files], id="files-table")]
    if run.summary is not None and run.summary.config:
        parts.append(el("details", el("summary", "The run's config"),
                        el("pre", json.dumps(run.summary.config, indent=2, default=str))))
    return section("provenance", "Provenance", *parts)

