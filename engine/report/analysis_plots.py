"""The analysis commands' figures: faithfulness.png (each surrogate against u_FT, one panel per representation and
surrogate) and transfer.png (the pairwise transfer scores as a clustered heatmap)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from convalue.engine.report.plots import _figure, png_bytes

#: cells annotated with their signed rank up to this many groups
ANNOTATE_MAX = 24


def plot_faithfulness(table: pa.Table, agreements: list[dict]) -> bytes:
    """One scatter per representation x surrogate: the surrogate's score of each subset against its u_FT, the
    Spearman rho, p-value and top overlap in the title; the top subsets by u_FT drawn filled."""
    u = np.asarray(table.column("u_ft").to_pylist(), dtype=np.float64)
    top = {a["top"] for a in agreements}.pop() if agreements else 0
    best = set(np.lexsort((np.arange(u.size), -u))[:top].tolist())
    reps = list(dict.fromkeys(a["representation"] for a in agreements))
    surrogates = list(dict.fromkeys(a["surrogate"] for a in agreements))
    fig = _figure(3.6 * max(len(surrogates), 1), 3.2 * max(len(reps), 1))
    axes = fig.subplots(max(len(reps), 1), max(len(surrogates), 1), squeeze=False)
    for a in agreements:
        ax = axes[reps.index(a["representation"])][surrogates.index(a["surrogate"])]
        s = np.asarray(table.column(f"{a['representation']}_{a['surrogate']}").to_pylist(), dtype=np.float64)
        filled = np.array([i in best for i in range(u.size)])
        ax.scatter(s[~filled], u[~filled], s=16, color="#8fb8c9", edgecolor="none")
        ax.scatter(s[filled], u[filled], s=22, color="#2a6f9d", edgecolor="black", linewidth=0.5,
                   label=f"top-{top} by u_FT")
        ax.axhline(0.0, color="grey", linewidth=0.6)
        ax.set_title(f"{a.get('method', a['surrogate'])}: Spearman rho {a['spearman_rho']:+.3f}\n"
                     f"p {a['p_value']:.3f}, top-{a['top']} overlap {a['top_overlap']}/{a['top']}", fontsize=8)
        ax.set_xlabel(f"{a['surrogate']} surrogate", fontsize=8)
        ax.set_ylabel("u_FT = L(target) - L(target + S)", fontsize=8)
        ax.tick_params(labelsize=7)
    if agreements:
        axes[0][0].legend(fontsize=7, loc="best")
    fig.suptitle(f"Surrogate scores against fine-tuned utility over {u.size} subsets", fontsize=9)
    return png_bytes(fig)


def plot_transfer(W: np.ndarray, R: np.ndarray, names: list[str], order: list[int]) -> bytes:
    """Row t (target) by column j (source): the KMM score w_j with group t as the target, rows and columns in
    `order` (cluster_order), diverging colours centred at 0 (each row scaled by its largest |w|, so every target's
    scores are visible), each cell annotated with its signed rank for up to ANNOTATE_MAX groups; the diagonal
    blank."""
    # matplotlib (slow to import): only when a heatmap is drawn
    from matplotlib.colors import TwoSlopeNorm

    W = np.asarray(W, dtype=np.float64)[np.ix_(order, order)]
    R = np.asarray(R, dtype=np.float64)[np.ix_(order, order)]
    labels = [names[i] for i in order]
    scale = np.nanmax(np.abs(W), axis=1, keepdims=True)
    shown = np.divide(W, scale, out=np.zeros_like(W), where=np.nan_to_num(scale) > 0)
    shown[np.isnan(W)] = np.nan
    M = len(labels)
    size = min(3.0 + 0.38 * M, 40.0)
    fig = _figure(size + 1.2, size)
    ax = fig.add_subplot()
    # matplotlib (slow to import): only when a heatmap is drawn
    from matplotlib import colormaps

    cmap = colormaps["RdBu_r"].with_extremes(bad="#d9d9d9")  # the diagonal: no group is its own source
    image = ax.imshow(np.ma.masked_invalid(shown), cmap=cmap, norm=TwoSlopeNorm(0.0, -1.0, 1.0),
                      interpolation="nearest")
    ax.set_xticks(range(M), labels, rotation=90, fontsize=7)
    ax.set_yticks(range(M), labels, fontsize=7)
    ax.set_xlabel("source group (candidate)", fontsize=8)
    ax.set_ylabel("target group", fontsize=8)
    if M <= ANNOTATE_MAX:
        for t in range(M):
            for j in range(M):
                if np.isfinite(R[t, j]) and R[t, j] != 0:
                    ax.text(j, t, f"{int(R[t, j]):+d}", ha="center", va="center", fontsize=6,
                            color="white" if abs(shown[t, j]) > 0.6 else "black")
    bar = fig.colorbar(image, ax=ax, shrink=0.7)
    bar.set_label("KMM score / max |score| of the row", fontsize=8)
    ax.set_title("Pairwise transfer: KMM scores of each source for each target (signed ranks in the cells)",
                 fontsize=9)
    return png_bytes(fig)
