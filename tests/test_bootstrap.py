"""Bootstrap over the previews: resampled KMM scores, their spread, and the selection's stability."""

from __future__ import annotations

import numpy as np
import pytest

from convalue.engine.report.tables import format_bootstrap
from convalue.engine.selection.bootstrap import (
    bootstrap_table,
    resample,
    split_resamples,
    stability,
)
from convalue.engine.selection.select import rank_order, select_top_k
from convalue.engine.selection.solve import SolveSpec
from convalue.solvers import solve_kmm

SPEC = SolveSpec(gamma=0.01, normalize="cosine")


def _groups(noise: float, seed: int = 0) -> tuple[list[np.ndarray], np.ndarray]:
    """6 groups of 8 per-example vectors around 6 directions; the target sits between the first two."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((6, 32))
    examples = [c + noise * rng.standard_normal((8, 32)) for c in centres]
    target = (centres[0] + 0.7 * centres[1]) + noise * rng.standard_normal((8, 32))
    return examples, target


def _solve(G, g):
    return SPEC.scores(G, g)


def test_a_resample_is_solved_as_the_run_solves():
    examples, target = _groups(0.3)
    G, g = np.stack([x.mean(0) for x in examples]), target.mean(0)
    w, beta = SPEC.scores(G, g)
    np.testing.assert_allclose(beta, G @ g)
    np.testing.assert_allclose(w, solve_kmm(G @ G.T, G @ g, gamma=0.01, normalize="cosine").w, atol=1e-10)
    w2, _ = SPEC.replace(space="gradients").scores(G, g)  # the gradient-space solver, same optimum
    np.testing.assert_allclose(w2, w, atol=1e-6)


def test_identical_examples_leave_nothing_to_resample():
    examples, target = _groups(0.0)
    W, S = resample(examples, target, samples=5, seed=0, k=2, solve=_solve)
    G = np.stack([x.mean(0) for x in examples])
    w, beta = _solve(G, target.mean(0))
    np.testing.assert_allclose(W, np.tile(w, (5, 1)), atol=1e-12)
    selected = select_top_k(w, beta, 2)
    table = bootstrap_table([f"g{i}" for i in range(6)], w, rank_order(w, beta), W, S)
    rows = {r["group"]: r for r in table.to_pylist()}
    assert all(r["score_std"] == pytest.approx(0, abs=1e-12) for r in rows.values())
    assert [rows[f"g{i}"]["p_selected"] for i in range(6)] == [1.0 if i in selected else 0.0 for i in range(6)]
    assert stability([f"g{i}" for i in range(6)], selected, S)["same_selection"] == 1.0


def test_noisy_previews_spread_the_scores_deterministically():
    examples, target = _groups(1.5)
    W, S = resample(examples, target, samples=40, seed=3, k=2, solve=_solve)
    W2, S2 = resample(examples, target, samples=40, seed=3, k=2, solve=_solve)
    assert np.array_equal(W, W2) and np.array_equal(S, S2)  # seeded
    assert not np.array_equal(W, resample(examples, target, samples=40, seed=4, k=2, solve=_solve)[0])
    G = np.stack([x.mean(0) for x in examples])
    w, beta = _solve(G, target.mean(0))
    table = bootstrap_table([f"g{i}" for i in range(6)], w, rank_order(w, beta), W, S)
    assert table.column_names == ["group", "score", "score_mean", "score_std", "score_q025", "score_q975",
                                  "p_positive", "p_selected"]
    rows = table.to_pylist()
    assert rows[0]["score"] == w.max()  # the run's ranking
    assert max(r["score_std"] for r in rows) > 0
    for r in rows:
        assert r["score_q025"] <= r["score_mean"] <= r["score_q975"] and 0 <= r["p_selected"] <= 1
    assert (S.sum(axis=1) <= 2).all()  # at most k per resample
    stats = stability([f"g{i}" for i in range(6)], select_top_k(w, beta, 2), S)
    assert 0 <= stats["same_selection"] <= 1 and stats["samples"] == 40
    line = format_bootstrap(stats)
    assert "40 resamples" in line and f"{stats['same_selection']:.0%}" in line
    # the target leans on g0 and g1: they are bought far more often than the unrelated groups
    p = S.mean(axis=0)
    assert min(p[0], p[1]) > max(p[2:])


def test_resamples_do_not_depend_on_how_they_are_split():
    """Each resample has its own seeded stream: drawn in parts (as the run spreads them over actors) they equal
    the resamples drawn in one go."""
    examples, target = _groups(1.0)
    W, S = resample(examples, target, samples=11, seed=5, k=2, solve=_solve)
    parts = split_resamples(11, 4)
    assert parts == [(0, 3), (3, 3), (6, 2), (8, 3)]
    pieces = [resample(examples, target, samples=c, seed=5, k=2, solve=_solve, first=f) for f, c in parts]
    assert np.array_equal(np.vstack([p[0] for p in pieces]), W) and np.array_equal(np.vstack([p[1] for p in pieces]), S)


@pytest.mark.parametrize("samples, parts", [(1, 8), (7, 1), (12, 8), (100, 3), (5, 5)])
def test_split_resamples_covers_every_resample_once(samples, parts):
    split = split_resamples(samples, parts)
    assert 1 <= len(split) <= min(samples, parts) and all(c >= 1 for _, c in split)
    assert [i for f, c in split for i in range(f, f + c)] == list(range(samples))
    assert max(c for _, c in split) - min(c for _, c in split) <= 1
