"""The run's figures: scores.png (signed KMM scores by rank), evaluation.png (each evaluation's loss against k)
and curves.png (finetune.eval_every's learning curves)."""

from __future__ import annotations

import io

import numpy as np
import pyarrow as pa

from convalue.engine.protocol.curves import CellCurve
from convalue.engine.protocol.evaluate import label_of
from convalue.engine.protocol.measures import Measure
from convalue.engine.protocol.summaries import summarise_measure
from convalue.engine.report.tables import measure_heading, shown_measures

SCORES_SHOWN = 40  # most bars in scores.png; the whole ranking is in scores.parquet
COLOURS = {"positive": "#2a9d8f", "negative": "#e76f51"}


def _figure(width: float, height: float):
    """A pyplot-free figure (no global state, no display backend)."""
    # matplotlib (slow to import): only when a figure is drawn; `convalue status` draws none
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def png_bytes(fig) -> bytes:
    """The figure as PNG bytes (the run record writes them)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    return buf.getvalue()


def plot_scores(table: pa.Table, limit: int = SCORES_SHOWN) -> bytes:
    """Horizontal bars of the non-zero scores w by rank (past `limit`: the highest and the most negative ones),
    the selected candidates outlined and starred."""
    rows = table.to_pylist()  # sorted by rank
    nonzero = [r for r in rows if r["score"] != 0]
    negative = [r for r in nonzero if r["score"] < 0]
    if len(nonzero) <= limit:
        shown, cut = nonzero, None
    else:
        tail = min(len(negative), limit // 4)
        shown, cut = nonzero[: limit - tail] + (nonzero[-tail:] if tail else []), limit - tail
    fig = _figure(7.5, 1.4 + 0.24 * max(len(shown), 1))
    ax = fig.add_subplot()
    y = list(range(len(shown)))[::-1]  # rank 1 on top
    ax.barh(y, [r["score"] for r in shown], color=[COLOURS["positive" if r["score"] > 0 else "negative"]
                                                      for r in shown],
            edgecolor=["black" if r["selected"] else "none" for r in shown], linewidth=1.2)
    ax.set_yticks(y, [f"{r['rank']}. {r['group']}{' *' if r['selected'] else ''}" for r in shown], fontsize=8)
    ax.axvline(0.0, color="black", linewidth=0.6)
    if cut is not None and cut < len(shown):
        ax.axhline(len(shown) - cut - 0.5, color="grey", linestyle="--", linewidth=0.8)  # ranks left out
    n_pos = len(nonzero) - len(negative)
    ax.set_title(f"KMM scores w of {len(rows)} candidates: {n_pos} positive, {len(negative)} negative, "
                 f"{len(rows) - len(nonzero)} zero (not drawn)" + ("" if cut is None else
                 f"; {len(shown)} drawn") + "; * selected", fontsize=9)
    ax.set_xlabel("score w (positive: helps the target, negative: hurts, 0: redundant or irrelevant)", fontsize=8)
    return png_bytes(fig)


def plot_evaluation(rows: list[dict], evaluation: dict) -> bytes:
    """One panel per evaluation and metric (finetune.select_by's first), each titled with the evaluation it shows:
    the value against k for each method (mean over seeds, ± sd bars where there are several; its best k starred),
    with target-only and base-model lines."""
    shown = shown_measures(evaluation)
    main = shown[0][0]
    cols = min(len(shown), 2)
    nrows = -(-len(shown) // cols)
    fig = _figure(6.5 * cols, 4.0 * nrows)
    axes = fig.subplots(nrows, cols, squeeze=False).ravel()
    seeds = evaluation.get("seeds") or []
    for ax, (measure, _) in zip(axes, shown):
        _evaluation_panel(ax, rows, evaluation, measure, len(seeds), measure == main)
    for ax in axes[len(shown):]:
        ax.set_visible(False)
    over = f"; mean ± sd over {len(seeds)} seeds" if len(seeds) > 1 else ""
    fig.suptitle(f"Fixed compute: {rows[0]['steps']} steps per run (star: the method's best k{over})", fontsize=10)
    return png_bytes(fig)


def _evaluation_panel(ax, rows: list[dict], evaluation: dict, measure: Measure, n_seeds: int, selects: bool) -> None:
    """One measure's panel: each method's line over k, the target alone and the base model."""
    ks = evaluation["ks"]
    summary = summarise_measure(rows, ks, measure)
    for m in [m for m in evaluation["methods"] if m in summary.methods]:
        means, sds = [summary.cells[m, k].mean for k in ks], [summary.cells[m, k].sd or 0.0 for k in ks]
        line = ax.errorbar(ks, means, yerr=sds if n_seeds > 1 else None, marker="o", capsize=3,
                           label=f"{label_of(m)} (Borda {summary.borda[m]:g})").lines[0]
        best = summary.best_k[m]
        ax.plot([best.k], [best.value.mean], marker="*", markersize=14, color=line.get_color())
    if (target := summary.target_only) is not None:
        ax.axhline(target.mean, color="black", linestyle="--", linewidth=1, label=label_of("target_only"))
        if target.sd is not None:
            ax.axhspan(target.mean - target.sd, target.mean + target.sd, color="black", alpha=0.08, linewidth=0)
    if summary.base is not None:
        ax.axhline(summary.base, color="grey", linestyle=":", linewidth=1, label="base model")
    ax.set_xticks(ks)
    ax.set_xlabel("k: groups bought (top-k with a positive score)")
    ax.set_ylabel(f"{measure.metric} ({'lower' if measure.lower_is_better else 'higher'} is better)")
    ax.set_title(measure_heading(measure) + (" — select_by" if selects else ""), fontsize=9)
    ax.legend(fontsize=7)


def plot_curves(evaluation: dict) -> bytes:
    """finetune.eval_every's learning curves: one panel per evaluation, each cell's mean loss over its seeds
    against steps (a marker at its lowest point), select_by's evaluation first."""
    curves = [c for c in map(CellCurve.from_dict, evaluation.get("curves") or []) if c is not None]
    main = Measure.of_evaluation(evaluation).evaluation
    names = sorted({c.evaluation for c in curves}, key=lambda n: (n != main, n))
    fig = _figure(6.5 * min(len(names), 2), 4.0 * -(-len(names) // 2))
    axes = fig.subplots(-(-len(names) // 2), min(len(names), 2), squeeze=False).ravel()
    for ax, name in zip(axes, names):
        for c in (c for c in curves if c.evaluation == name):
            line = ax.plot(c.steps, c.mean, linewidth=1.4 if c.method in ("kmm", "target_only") else 0.9,
                           linestyle="--" if c.method == "target_only" else "-", label=c.label)[0]
            if c.best_step is not None:
                ax.plot([c.best_step], [c.best], marker="o", color=line.get_color())
        ax.set_xlabel("step")
        ax.set_ylabel("loss (lower is better)")
        ax.set_title(f"loss on {name} during training" + (" — select_by" if name == main else ""), fontsize=9)
        ax.legend(fontsize=6, ncol=2)
    for ax in axes[len(names):]:
        ax.set_visible(False)
    fig.suptitle("Learning curves (finetune.eval_every): mean over seeds; a dot at each cell's lowest point",
                 fontsize=10)
    return png_bytes(fig)


def plot_path(gammas: np.ndarray, W: np.ndarray, names: list[str], shown: int = 12) -> bytes:
    """Scores w against gamma along the regularisation path (log scale), the `shown` candidates that turn positive
    first labelled; every other candidate a thin grey line."""
    fig = _figure(7.5, 4.5)
    ax = fig.subplots()
    first = np.array([np.argmax(W[:, i] > 0) if np.any(W[:, i] > 0) else len(gammas) for i in range(W.shape[1])])
    order = np.argsort(first, kind="stable")
    labelled = set(order[:shown].tolist())
    for i in range(W.shape[1]):
        if i in labelled:
            ax.plot(gammas, W[:, i], linewidth=1.6, label=names[i])
        else:
            ax.plot(gammas, W[:, i], color="#bbbbbb", linewidth=0.6)
    ax.set_xscale("log")
    ax.invert_xaxis()
    ax.axhline(0, color="black", linewidth=0.6)
    ax.set_xlabel("gamma (l1 penalty; decreasing to the right)")
    ax.set_ylabel("KMM score w")
    ax.set_title("Regularisation path: the order in which candidates are bought")
    if labelled:
        ax.legend(fontsize=7, ncol=2, loc="upper left")
    return png_bytes(fig)
