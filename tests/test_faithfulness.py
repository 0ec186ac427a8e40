"""Subset faithfulness: the C(8, 3) enumeration, both surrogates, Spearman and top-10 overlap, the Parquet table."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from convalue.engine.protocol.faithfulness import (
    Agreement,
    additive_surrogate,
    agreement,
    cosine_inputs,
    enumerate_subsets,
    faithfulness,
    faithfulness_table,
    kmm_surrogate,
)


def planted(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(G, K, beta) of 8 candidates, some of them near-duplicates so that redundancy matters."""
    rng = np.random.default_rng(seed)
    base = rng.normal(size=(4, 6))
    G = np.vstack([base, base + 0.1 * rng.normal(size=(4, 6))])
    g_tar = base.sum(axis=0) + 0.5 * rng.normal(size=6)
    return G, G @ G.T, G @ g_tar


def test_enumeration_is_the_papers_56_subsets_or_a_seeded_sample():
    subsets = enumerate_subsets(8, 3)
    assert len(subsets) == math.comb(8, 3) == 56
    assert subsets == list(itertools.combinations(range(8), 3))
    sample = enumerate_subsets(8, 3, sample=20, seed=1)
    assert len(set(sample)) == 20 and set(sample) <= set(subsets) and sample == sorted(sample)
    assert enumerate_subsets(8, 3, sample=20, seed=1) == sample != enumerate_subsets(8, 3, sample=20, seed=2)
    big = enumerate_subsets(60, 6, sample=15, seed=0)  # C(60, 6) > 10^6: drawn directly
    assert len(set(big)) == 15 and all(len(set(s)) == 6 for s in big)
    with pytest.raises(ValueError):
        enumerate_subsets(3, 4)


def test_surrogates_are_the_papers_sums():
    _, K, beta = planted()
    S = [(0, 4, 7)]
    assert additive_surrogate(S, beta)[0] == pytest.approx(beta[0] + beta[4] + beta[7])
    w = np.zeros(8)
    w[[0, 4, 7]] = 1.0
    assert kmm_surrogate(S, K, beta)[0] == pytest.approx(beta @ w - 0.5 * w @ K @ w)  # i = j included


def test_kmm_surrogate_is_faithful_where_it_is_the_utility_and_the_additive_one_is_not():
    _, K, beta = planted()
    subsets = enumerate_subsets(8, 3)
    u_ft = kmm_surrogate(subsets, K, beta)  # planted: the fine-tune utility is exactly KMM's
    rows = {r.surrogate: r for r in faithfulness(subsets, u_ft, {"tv": (K, beta)})}
    assert rows["kmm"].spearman_rho == pytest.approx(1.0) and rows["kmm"].top_overlap == 10
    assert rows["kmm"].p_value < 1e-10 and rows["kmm"].subsets == 56 and rows["kmm"].top == 10
    assert rows["additive"].spearman_rho < 0.9 and rows["additive"].top_overlap < 10
    assert isinstance(rows["kmm"], Agreement) and rows["kmm"].to_dict()["representation"] == "tv"


def test_agreement_counts_the_top_overlap():
    u = np.arange(20, dtype=float)
    s = u.copy()
    s[[19, 0]] = s[[0, 19]]  # the best and the worst swapped
    rho, p, overlap = agreement(u, s, top=10)
    assert overlap == 9 and rho < 1 and 0 <= p < 1
    assert agreement(u, -u)[0] == pytest.approx(-1.0) and agreement(u, -u)[2] == 0


def test_cosine_inputs_are_cosines():
    G, K, _ = planted()
    rng = np.random.default_rng(3)
    g = rng.normal(size=6)
    Kc, bc = cosine_inputs(K, G @ g, float(np.linalg.norm(g)))
    unit = G / np.linalg.norm(G, axis=1, keepdims=True)
    assert np.allclose(Kc, unit @ unit.T) and np.allclose(bc, unit @ (g / np.linalg.norm(g)))


def test_table_has_a_row_per_subset_and_a_column_per_surrogate():
    _, K, beta = planted()
    subsets = enumerate_subsets(8, 3)
    u = np.linspace(0, 1, 56)
    names = [f"g{i}" for i in range(8)]
    table = faithfulness_table(subsets, u, {"one_step": (K, beta), "tv": (K, beta)}, names)
    assert table.column_names == ["subset", "u_ft", "one_step_additive", "one_step_kmm", "tv_additive", "tv_kmm"]
    assert table.num_rows == 56 and table["subset"][0].as_py() == ["g0", "g1", "g2"]
    assert np.allclose(table["tv_kmm"].to_numpy(), kmm_surrogate(subsets, K, beta))
    assert faithfulness_table(subsets, u, {"tv": (K, beta)})["subset"][55].as_py() == [5, 6, 7]
