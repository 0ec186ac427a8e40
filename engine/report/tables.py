"""Result tables and files: scores.parquet, gram/beta, summary.json, and the printed ranking."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from convalue.engine.data.examples import Group
from convalue.engine.protocol.curves import CellCurve
from convalue.engine.protocol.evaluate import CellLoss, label_of
from convalue.engine.protocol.measures import Measure
from convalue.engine.protocol.summaries import summarise_measure
from convalue.engine.protocol.verdict import verdict_from_evaluation
from convalue.engine.selection.select import ranks
from convalue.engine.store.finetunes import curve_is_valid


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


def _first(ex, role: str) -> str:
    """The first message of `role` in a chat example ('' if none)."""
    return next((c for r, c in ex.messages if r == role), "")


def examples_table(target: Group, candidates: list[Group], n: int = 3, target_key: str = "__target__") -> pa.Table:
    """A few examples of every candidate group and of the target (group `target_key`), for report.html."""
    rows = [(target_key, ex) for ex in target.examples[:n]] + [(g.name, ex) for g in candidates
                                                                for ex in g.examples[:n]]
    return pa.table({
        "group": pa.array([g for g, _ in rows], pa.string()),
        "prompt": pa.array([_first(ex, "user") for _, ex in rows], pa.string()),
        "response": pa.array([_first(ex, "assistant") for _, ex in rows], pa.string()),
    })


def clusters_table(groups: list[Group], valued: set[str]) -> pa.Table | None:
    """Which example of a flat pool went to which cluster: one row per example of the clustered groups (or None).

    valued: the groups the run scores (a cluster smaller than the preview may be skipped).
    """
    rows = [(g.name, src, i, ex) for g in groups if g.members is not None
            for (src, i), ex in zip(g.members, g.examples)]
    if not rows:
        return None

    return pa.table({
        "group": pa.array([r[0] for r in rows], pa.string()),
        "source_group": pa.array([r[1] for r in rows], pa.string()),
        "index": pa.array([r[2] for r in rows], pa.int64()),
        "prompt": pa.array([_first(r[3], "user") for r in rows], pa.string()),
        "response": pa.array([_first(r[3], "assistant") for r in rows], pa.string()),
        "valued": pa.array([r[0] in valued for r in rows], pa.bool_()),
    })


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
    # one pass over the named clusters' rows only (a flat pool's table has every example of thousands of clusters)
    named = table.filter(pc.is_in(table["group"], value_set=pa.array(groups, pa.string())))
    by_group: dict[str, list[str]] = {g: [] for g in groups}
    for g, p in zip(named["group"].to_pylist(), named["prompt"].to_pylist()):
        by_group[g].append(p)
    lines = ["what the selected clusters hold (first prompts; all in clusters.parquet):"]
    for g in groups:
        prompts = by_group[g]
        distinct = list(dict.fromkeys(prompts))[:n]
        shown = " | ".join(repr(p if len(p) <= width else p[: width - 1] + "…") for p in distinct)
        lines.append(f"  {g} ({len(prompts)} examples): {shown}")
    return "\n".join(lines)


def evaluation_table(rows: list[dict]) -> pa.Table:
    """One row per fine-tune of the evaluation protocol (method, k, seed), as summary.json's `finetune` lists them;
    `points` and `best` are their cell's on finetune.select_by (on the mean over seeds); `val_loss` is the target's
    validation loss, `evaluations` every evaluation's loss (and accuracy) where data.eval names more; accuracy and
    GRPO's training rewards where measured."""
    table = pa.table({
        "method": pa.array([r["method"] for r in rows], pa.string()),
        "k": pa.array([r["k"] for r in rows], pa.int64()),
        "seed": pa.array([r.get("seed") for r in rows], pa.int64()),
        "label": pa.array([r["label"] for r in rows], pa.string()),
        "groups": pa.array([r["groups"] for r in rows], pa.list_(pa.string())),
        "weights": pa.array([None if r.get("weights") is None else [r["weights"][g] for g in r["groups"]]
                             for r in rows], pa.list_(pa.float64())),
        "val_loss": pa.array([r["val_loss"] for r in rows], pa.float64()),
        "points": pa.array([r["points"] for r in rows], pa.float64()),
        "best": pa.array([r["best"] for r in rows], pa.bool_()),
        "rho": pa.array([r.get("rho") for r in rows], pa.float64()),
        "target_steps": pa.array([r["target_steps"] for r in rows], pa.int64()),
        "aux_steps": pa.array([r["aux_steps"] for r in rows], pa.int64()),
        "reused": pa.array([r["reused"] for r in rows], pa.bool_()),
    })
    for name, kind in (("val_accuracy", pa.float64()), ("objective", pa.string()),
                       ("train_reward_first", pa.float64()), ("train_reward_last", pa.float64()),
                       ("train_rewards", pa.list_(pa.float64()))):
        if any(r.get(name) is not None and r.get(name) != "sft" for r in rows):
            table = table.append_column(name, pa.array([r.get(name) for r in rows], kind))
    if any(len(r.get("evaluations") or {}) > 1 for r in rows):  # data.eval: every evaluation's values, by name
        table = table.append_column("evaluations", pa.array(
            [[{"evaluation": n, "loss": v.get("loss"), "accuracy": v.get("accuracy")}
              for n, v in (r.get("evaluations") or {}).items()] for r in rows], EVALUATIONS_TYPE))
    if any(r.get("curve") for r in rows):  # finetune.eval_every: each fine-tune's learning curve
        table = table.append_column("curve", pa.array(
            [[{"step": p["step"], "evaluation": n, "loss": v} for p in r["curve"] for n, v in p["losses"].items()]
             if curve_is_valid(r.get("curve")) else None for r in rows], CURVE_TYPE))
    return table


#: evaluation.parquet's `evaluations`: each fine-tune's values on every evaluation
EVALUATIONS_TYPE = pa.list_(pa.struct([("evaluation", pa.string()), ("loss", pa.float64()),
                                       ("accuracy", pa.float64())]))
#: evaluation.parquet's `curve`: each fine-tune's loss on every evaluation every finetune.eval_every steps
CURVE_TYPE = pa.list_(pa.struct([("step", pa.int64()), ("evaluation", pa.string()), ("loss", pa.float64())]))


def format_bootstrap(stats: dict) -> str:
    """One line on the selection's stability over the bootstrap resamples of the previews."""
    freq = ", ".join(f"{g} {p:.0%}" for g, p in stats["p_selected"].items()) or "-"
    return (f"bootstrap over the previews ({stats['samples']} resamples): the same selection in "
            f"{stats['same_selection']:.0%} of them; how often each selected group was chosen: {freq} "
            "(bootstrap.parquet: every group's spread)")


def _loss(c: CellLoss) -> str:
    """A cell's loss: the mean, with ± its standard deviation over seeds."""
    return f"{c.mean:.4f}" + ("" if c.sd is None else f"±{c.sd:.4f}")


def _interval(ci: list[float] | None) -> str:
    """A paired difference's 95 % interval, as printed after its mean ± sd (nothing for a summary without one)."""
    return "" if ci is None else f" [95% CI {ci[0]:+.4f}, {ci[1]:+.4f}]"


def shown_measures(evaluation: dict) -> list[tuple[Measure, str]]:
    """The measures the evaluation reports, finetune.select_by's first, each with its evaluation's description
    (summaries written before data.eval existed: select_by's metric on the target's validation split, then the
    other metric where it was measured)."""
    main = Measure.of_evaluation(evaluation)
    records = [r for r in evaluation.get("evaluations") or [] if isinstance(r, dict)]
    if records:
        shown = [(Measure(r["evaluation"], r["metric"]), _described(r)) for r in records]
    else:
        shown = [(main, "")] + [(Measure(main.evaluation, m), "") for m in ("loss", "accuracy")
                                if m != main.metric and f"by_{m}" in evaluation]
    shown.sort(key=lambda x: x[0] != main)  # stable: the select_by measure first, the rest in their order
    return shown


def _described(record: dict) -> str:
    """An evaluation's source and size, as a table's heading names it."""
    source, n = record.get("source"), record.get("examples")
    return "" if source is None else f"{source}, {n} examples" if n is not None else str(source)


def measure_heading(measure: Measure) -> str:
    """What a table shows, naming its evaluation: `target validation loss`, `loss on evaluation 'heldout'`."""
    if measure.evaluation == Measure().evaluation:
        return f"target validation {measure.metric} (target_val)"
    return f"{measure.metric} on evaluation {measure.evaluation!r}"


def format_evaluation(rows: list[dict], evaluation: dict | None) -> str:
    """The protocol's tables, one per evaluation and metric, finetune.select_by's first (value per method and k, mean
    ± sd over seeds where there are several; best k starred; Borda count; KMM's paired differences), and what each
    run bought."""
    if not rows or evaluation is None:
        return "fine-tune: disabled"
    main = Measure.of_evaluation(evaluation)
    lines: list[str] = []
    for measure, about in shown_measures(evaluation):
        lines += _metric_table(rows, evaluation, measure, about, measure == main)
    tuned = tuning_table(evaluation)
    if tuned is not None:
        about, head, body = tuned
        lines += [about, "  " + " | ".join(head), *("  " + " | ".join(r) for r in body)]
    lines += curve_lines(evaluation, main.evaluation)
    return "\n".join(lines + _bought_lines(rows, bool(len(evaluation.get("seeds") or []) > 1)))


def curve_lines(evaluation: dict, where: str) -> list[str]:
    """finetune.eval_every's learning curves on evaluation `where`, one line per cell: the step of its lowest mean
    loss, that loss, and the loss at the last step all its seeds measured (none where no curve was measured; a
    damaged entry is left out)."""
    listed = evaluation.get("curves")
    curves = [c for c in map(CellCurve.from_dict, listed if isinstance(listed, list) else [])
              if c is not None and c.evaluation == where and c.best_step is not None]
    if not curves:
        return []
    lines = [f"learning curves: loss on {where} against steps (mean over seeds); where each cell's is lowest"]
    for c in curves:
        lines.append(f"  {c.label:<24} lowest {c.best:.4f} at step {c.best_step}; at step {c.steps[-1]}, the last "
                     f"all {c.seeds} seed(s) measured: {c.mean[-1]:.4f}")
    return lines


def tuning_table(evaluation: dict) -> tuple[str, list[str], list[list[str]]] | None:
    """finetune.tune's record as (what it did, heading, one row per k: each ratio's mean, the chosen one starred),
    or None where rho_k was not tuned (or the record is not one: a report never fails on a damaged summary)."""
    t = evaluation.get("tuning")
    grid = t.get("grid") if isinstance(t, dict) else None
    values, chosen = (t.get("values"), t.get("chosen")) if isinstance(t, dict) else (None, None)
    if not (isinstance(grid, list) and isinstance(values, dict) and isinstance(chosen, dict)):
        return None
    tunes = t.get("fine_tunes") if isinstance(t.get("fine_tunes"), dict) else {}
    about = (f"rho_k tuned on {t.get('by')} (not the reported evaluation) with seed(s) {t.get('seeds')} (not the "
             f"reported ones; {tunes.get('trained', '?')} fine-tunes trained, {tunes.get('reused', '?')} read back): "
             "each ratio's mean over the methods that buy at k; * the chosen rho_k, used by every method at k")
    body = []
    for k, means in values.items():
        if not isinstance(means, list):
            continue
        cells = [f"{v:.4f}" + (" *" if r == chosen.get(k) else "") if isinstance(v, (int, float)) else "-"
                 for r, v in zip(grid, means)]
        body.append([f"k = {k}", *cells, f"rho_k = {chosen[k]}" if k in chosen else "none bought (target alone)"])
    return about, ["budget", *(f"rho = {r}" for r in grid), "chosen"], body


def tuned_before_failure(tuning: dict) -> str:
    """A failed run's rho_k, chosen before the failure (summary.json's finetune_tuning), in one sentence."""
    chosen = tuning.get("chosen") if isinstance(tuning.get("chosen"), dict) else {}
    each = ", ".join(f"k = {k}: {r}" for k, r in chosen.items()) or "no budget bought a group"
    return (f"rho_k had been tuned on {tuning.get('by', '?')} before the failure ({each}; summary.json's "
            "finetune_tuning); a rerun reads its fine-tunes back")


def _metric_table(rows: list[dict], evaluation: dict, measure: Measure, about: str, selects: bool) -> list[str]:
    """One measure's table: the cells (mean ± sd), best k starred, Borda, target only, base, KMM's paired
    differences."""
    ks = evaluation["ks"]
    summary = summarise_measure(rows, ks, measure)
    methods = [m for m in evaluation["methods"] if m in summary.methods]
    cell, what = summary.cells, measure.metric
    better = "lower" if measure.lower_is_better else "higher"
    seeds = evaluation.get("seeds") or []
    over = f"; mean ± sd over seeds {seeds}" if len(seeds) > 1 else ""
    best = {(m, b.k) for m, b in summary.best_k.items()}
    col = max([8] + [len(_loss(c)) for c in cell.values()]) + 1
    width = max([len("base model (theta_0)")] + [len(label_of(m)) for m in methods])
    role = "; finetune.select_by: it decides best k, Borda and the verdict" if selects else ""
    lines = [f"{measure_heading(measure)}{f' [{about}]' if about else ''} after {rows[0]['steps']} steps ({better} is "
             f"better; * the method's best k{over}{role}), Borda count over k (higher is better):",
             f"  {'method':<{width}} " + " ".join(f"{'k=' + str(k):>{col}}" for k in ks) + f" {'Borda':>7}"]
    for m in methods:
        values = " ".join(f"{_loss(cell[m, k]):>{col - 1}}{'*' if (m, k) in best else ' '}" for k in ks)
        lines.append(f"  {label_of(m):<{width}} {values} {summary.borda[m]:>7.1f}")
    if summary.target_only is not None:
        lines.append(f"  {label_of('target_only'):<{width}} {_loss(summary.target_only):>{col - 1}}  (every k)")
    if summary.base is not None:
        lines.append(f"  {'base model (theta_0)':<{width}} {summary.base:>{col - 1}.4f}")
    if over and summary.kmm_minus:
        lines.append(f"KMM's {what} minus each method's at each k, seed by seed (the seeds' draws are shared, so the "
                     "pairs cancel their noise; negative: KMM lower; an interval without 0: the paired t-test's "
                     "5 % level):")
        for m in dict.fromkeys(d.method for d in summary.kmm_minus):
            cells = [f"k={d.k} {d.mean:+.4f}±{d.sd:.4f}{_interval(d.ci95)} (KMM lower in "
                     f"{d.reference_lower} of {d.seeds})" for d in summary.kmm_minus if d.method == m]
            lines.append(f"  {label_of(m)}: " + ", ".join(cells))
    return lines


def _bought_lines(rows: list[dict], over: bool) -> list[str]:
    """What each run bought: its groups, target and auxiliary steps (per seed), stored or trained now."""
    lines = []
    mixed = " and mixture weights" if any(r.get("weights") for r in rows) else ""
    per_k = len({r.get("rho") for r in rows if r["groups"]}) > 1  # finetune.rho_by_k: say each run's rho_k
    lines.append(f"what each run bought{mixed} (" + ("rho_k; " if per_k else "") + "target steps / auxiliary steps"
                 + (", per seed" if over else "") + "; stored: trained by an earlier run here):")
    by_label: dict[str, list[dict]] = {}
    for r in rows:
        by_label.setdefault(r["label"], []).append(r)
    for label, runs in by_label.items():
        if len({(tuple(r["groups"]), str(r.get("weights"))) for r in runs}) == 1:
            lines.append(_bought(label, runs, per_k))
        else:  # the random baseline under finetune.random_orders per_seed: a selection per seed
            lines += [_bought(f"{label} (seed {r['seed']})", [r], per_k) for r in runs]
    return lines


def _bought(label: str, runs: list[dict], per_k: bool) -> str:
    """One line of "what each run bought": the groups (with their mixture weights), rho_k where it varies, each
    seed's target/auxiliary steps, and how many were stored."""
    steps = ", ".join(f"{r['target_steps']}/{r['aux_steps']}" for r in runs)
    stored = sum(bool(r.get("reused")) for r in runs)
    note = "" if not stored else "  stored" if stored == len(runs) else f"  stored: {stored} of {len(runs)}"
    weights = runs[0].get("weights")
    bought = ", ".join(g if weights is None else f"{g} {weights[g]:.2f}" for g in runs[0]["groups"]) or "-"
    rho = f"rho {runs[0]['rho']:g}; " if per_k and runs[0]["groups"] else ""
    return f"  {label}: {bought} ({rho}{steps}){note}"


def format_verdict(rows: list[dict], evaluation: dict | None, target_train: int | None) -> str:
    """The regime (target size, steps, seeds) with KMM's selection against the target alone at each k on
    finetune.select_by's measure, then the run's one verdict (engine.protocol.verdict); without an evaluation, the
    verdict alone (`not evaluated`)."""
    verdict = verdict_from_evaluation(evaluation).line()
    if not rows or evaluation is None:
        return verdict
    seeds = len(evaluation.get("seeds") or []) or 1
    regime = f"regime: a target of {target_train} train examples, {rows[0]['steps']} steps, {seeds} seed(s)"
    diffs = [d for d in evaluation.get("kmm_minus") or [] if d["method"] == "target_only"]
    if not diffs:
        return f"{regime}\n{verdict}"
    main = Measure.of_evaluation(evaluation)
    higher = not main.lower_is_better  # kmm_minus is on the select_by measure
    parts = []
    for d in diffs:
        ci = d.get("ci95")
        if ci is None:
            word = "one seed gives no interval (finetune.repeats >= 3 does)"
        elif (ci[0] > 0) if higher else (ci[1] < 0):
            word = "KMM's selection beats the target alone"
        elif (ci[1] < 0) if higher else (ci[0] > 0):
            word = "the target alone beats KMM's selection"
        else:
            word = "no difference the seeds can resolve"
        parts.append(f"k={d['k']} {d['mean']:+.4f}{_interval(ci)}: {word}")
    return f"{regime}; KMM minus target alone ({main.words}): " + "; ".join(parts) + f"\n{verdict}"
