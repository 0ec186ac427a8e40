"""Bootstrap over the previews: how much the KMM scores and the selection depend on which m examples previewed
each group (and the target). Every resample redraws each preview with replacement and re-solves KMM."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pyarrow as pa

from engine.gram import metric_vectors
from engine.kmm_solve import solve_gram, solve_vectors
from engine.prepare import TARGET_KEY
from engine.select import rank_order, select_top_k


def kmm_scores(G: np.ndarray, g_tar: np.ndarray, metric: str, space: str, settings: dict) -> tuple[np.ndarray,
                                                                                                    np.ndarray]:
    """(w, beta) for group vectors G and g_tar as the run solves them: its metric, its space (K = G G^T formed,
    or solved from the vectors), its solver settings."""
    Gm, gm, _ = metric_vectors(metric, np.asarray(G, np.float64), np.asarray(g_tar, np.float64))
    beta = Gm @ gm
    sol = solve_vectors(Gm, gm, settings) if space == "gradients" else solve_gram(Gm @ Gm.T, beta, settings)
    return sol.w, beta


def resample(examples: list[np.ndarray], target: np.ndarray, samples: int, seed: int, k: int,
             solve: Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray,
                                                                                                 np.ndarray]:
    """(W, S): the scores of each resample (samples x N) and whether each group was among its top-k positive.

    examples[i]: group i's per-example vectors (m_i x p); target: the target preview's (m x p). Resample b draws
    m_i rows of each with replacement (one seeded stream) and solves with solve(G_b, g_b) -> (w_b, beta_b).
    """
    rng = np.random.default_rng([seed, 0xB0])
    n = len(examples)
    W = np.empty((samples, n))
    S = np.zeros((samples, n), dtype=bool)
    for b in range(samples):
        G = np.stack([x[rng.integers(len(x), size=len(x))].mean(axis=0) for x in examples])
        g = target[rng.integers(len(target), size=len(target))].mean(axis=0)
        W[b], beta = solve(G, g)
        S[b, select_top_k(W[b], beta, k)] = True
    return W, S


def resample_run(examples: dict[str, np.ndarray], names: list[str], run: dict, samples: int,
                 seed: int) -> tuple[np.ndarray, np.ndarray]:
    """resample() of the groups `names` and the target (TARGET_KEY) from their per-example vectors, each resample
    solved as the run was: run = {metric, space, settings, k}."""
    return resample([examples[n] for n in names], examples[TARGET_KEY], samples, seed, run["k"],
                    lambda G, g: kmm_scores(G, g, run["metric"], run["space"], run["settings"]))


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
