"""Pairwise transfer: KMM scores of every group against the rest, signed ranks, positive/negative sets, order."""

from __future__ import annotations

import numpy as np
import pytest

from convalue.engine.protocol.transfer import (
    PositiveNegative,
    cluster_order,
    positive_negative,
    signed_ranks,
    transfer_scores,
)

NAMES = ["a0", "a1", "a2", "b0", "b1", "b2", "anti"]


def families() -> np.ndarray:
    """Family a along e1 and family b along e2, each member with an own orthogonal part (e3..e8), and `anti`
    along -e1: within a family the target is matched by the others, across families nothing is shared."""
    G = np.zeros((7, 10))
    for j in range(3):
        G[j, 0], G[j, 2 + j] = 1.0, 0.3
        G[3 + j, 1], G[3 + j, 5 + j] = 1.0, 0.3
    G[6, 0], G[6, 9] = -1.0, 0.3
    return G


def test_within_family_scores_are_positive_and_cross_family_ones_are_not():
    W = transfer_scores(families())
    assert W.shape == (7, 7) and np.all(np.isnan(np.diag(W))) and np.isfinite(W[~np.eye(7, dtype=bool)]).all()
    a, b = [0, 1, 2], [3, 4, 5]
    for fam, other in ((a, b), (b, a)):
        for t in fam:
            assert all(W[t, j] > 0 for j in fam if j != t)
            assert all(W[t, j] <= 1e-12 for j in other)
    assert all(W[t, 6] < 0 for t in a)  # the opposed group is harmful to family a
    assert np.allclose(W[:, 6][b], 0.0, atol=1e-12)


def test_scores_follow_gamma_and_need_no_normalisation():
    G = families()
    sparse = transfer_scores(G, gamma_ratio=0.9)
    dense = transfer_scores(G, gamma_ratio=0.01, normalize="none")
    off = ~np.eye(7, dtype=bool)
    assert np.abs(sparse[off]).sum() < np.abs(dense[off]).sum()
    with pytest.raises(ValueError):
        transfer_scores(G[:1])


def test_signed_ranks_are_anchored_at_zero():
    W = np.array([[np.nan, 0.5, -0.2, 0.0, 0.1], [0.3, np.nan, -0.4, -0.1, 1e-15]])
    R = signed_ranks(W)
    assert np.isnan(R[0, 0]) and list(R[0, 1:]) == [2.0, -1.0, 0.0, 1.0]
    assert list(R[1, [0, 2, 3, 4]]) == [1.0, -2.0, -1.0, 0.0]  # 1e-15 is round-off: zero


def test_positive_and_negative_sets_of_a_target():
    W = transfer_scores(families())
    pn = positive_negative(W, NAMES, "a0")
    assert isinstance(pn, PositiveNegative)
    assert set(pn.positive) == {"a1", "a2"} and pn.negative == ("anti",)
    assert pn.runs() == {"target_only": (), "pos": pn.positive, "pos_neg": pn.positive + ("anti",)}
    row = np.array([[np.nan, 3.0, 2.0, 1.0, -1.0, -2.0, -3.0]])
    W2 = np.vstack([row, np.zeros((6, 7))])
    pn2 = positive_negative(W2, NAMES, "a0", n_pos=2, n_neg=2)
    assert pn2.positive == ("a1", "a2") and pn2.negative == ("anti", "b2")  # best first, worst first


def test_cluster_order_keeps_families_together():
    order = cluster_order(transfer_scores(families()))
    assert sorted(order) == list(range(7))
    pos = {g: order.index(g) for g in range(7)}
    for fam in ([0, 1, 2], [3, 4, 5]):
        spots = sorted(pos[g] for g in fam)
        assert spots[-1] - spots[0] == 2  # contiguous
