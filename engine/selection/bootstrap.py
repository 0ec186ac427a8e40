"""Bootstrap over the previews: how much the KMM scores and the selection depend on which m examples previewed
each group (and the target). Every resample redraws each preview with replacement and re-solves KMM."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pyarrow as pa

from convalue.engine.data.prepare import TARGET_KEY
from convalue.engine.selection.select import rank_order, select_top_k
from convalue.engine.selection.solve import SolveSpec


def resample(examples: list[np.ndarray], target: np.ndarray, samples: int, seed: int, k: int,
             solve: Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]],
             first: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(W, S): the scores of resamples first .. first + samples - 1 (samples x N) and whether each group was among
    their top-k positive.

    examples[i]: group i's per-example vectors (m_i x p); target: the target preview's (m x p). Resample b draws
    m_i rows of each with replacement from its own seeded stream (so a resample is the same whichever worker
    draws it) and solves with solve(G_b, g_b) -> (w_b, beta_b).
    """
    n = len(examples)
    W = np.empty((samples, n))
    S = np.zeros((samples, n), dtype=bool)
    for j in range(samples):
        rng = np.random.default_rng([seed, 0xB0, first + j])
        G = np.stack([x[rng.integers(len(x), size=len(x))].mean(axis=0) for x in examples])
        g = target[rng.integers(len(target), size=len(target))].mean(axis=0)
        W[j], beta = solve(G, g)
        S[j, select_top_k(W[j], beta, k)] = True
    return W, S


def resample_run(examples: dict[str, np.ndarray], names: list[str], spec: SolveSpec, k: int, samples: int,
                 seed: int, first: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """resample() of the groups `names` and the target (TARGET_KEY) from their per-example vectors, each resample
    solved as the run was (spec) and its top-k selected."""
    return resample([examples[n] for n in names], examples[TARGET_KEY], samples, seed, k, spec.scores, first)


def split_resamples(samples: int, parts: int) -> list[tuple[int, int]]:
    """(first, count) of at most `parts` contiguous, near-equal runs of resamples covering 0 .. samples - 1."""
    parts = max(1, min(parts, samples))
    edges = np.linspace(0, samples, parts + 1).round().astype(int)
    return [(int(a), int(b - a)) for a, b in zip(edges[:-1], edges[1:]) if b > a]


def bootstrap_table(names: list[str], w: np.ndarray, order: np.ndarray, W: np.ndarray, S: np.ndarray) -> pa.Table:
    """One row per group in `order` (the run's ranking): its score, the resamples' mean, spread, 95 % interval,
    and how often it scored positive and was selected."""
    q_lo, q_hi = np.quantile(W, [0.025, 0.975], axis=0)
    return pa.table({
        "group": pa.array([names[i] for i in order], pa.string()),
        "score": pa.array(np.asarray(w, np.float64)[order]),
        "score_mean": pa.array(W.mean(axis=0)[order]),
        "score_std": pa.array(W.std(axis=0, ddof=1 if len(W) > 1 else 0)[order]),
        "score_q025": pa.array(q_lo[order]),
        "score_q975": pa.array(q_hi[order]),
        "p_positive": pa.array((W > 0).mean(axis=0)[order]),
        "p_selected": pa.array(S.mean(axis=0)[order]),
    })


def stability(names: list[str], selected: list[int], S: np.ndarray) -> dict:
    """How often the resamples chose exactly the run's selection, and each selected group's frequency."""
    run = np.zeros(S.shape[1], dtype=bool)
    run[selected] = True
    return {"samples": int(len(S)), "same_selection": float((S == run).all(axis=1).mean()),
            "p_selected": {names[i]: float(S[:, i].mean()) for i in selected}}


def outputs(names: list[str], w: np.ndarray, beta: np.ndarray, selected: list[int], W: np.ndarray, S: np.ndarray,
            seed: int) -> tuple[pa.Table, dict]:
    """(bootstrap.parquet's table in the run's rank order, summary.json's `bootstrap`) from the resamples."""
    return bootstrap_table(names, w, rank_order(w, beta), W, S), stability(names, selected, S) | {"seed": seed}
