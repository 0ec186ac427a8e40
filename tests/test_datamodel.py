"""DataModel designs (uniform, compressed sensing) and the LASSO fit recover planted additive utilities."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import spearmanr

from convalue.engine.protocol.datamodel import (
    alpha_max,
    cs_design,
    fit_datamodel,
    lasso,
    uniform_design,
    utilities_from_losses,
)

N = 20
TRUE = np.zeros(N)
TRUE[[1, 4, 7, 11, 15]] = [1.0, 0.8, 0.6, 0.5, 0.4]
TRUE[[2, 9, 18]] = [-0.7, -0.5, -0.3]


def planted(design, noise: float = 0.01, seed: int = 1) -> np.ndarray:
    """u(S) = sum_{i in S} w_i + N(0, noise^2) for every subset of the design."""
    rng = np.random.default_rng(seed)
    return np.array([TRUE[list(s)].sum() for s in design.subsets]) + rng.normal(0, noise, len(design.subsets))


@pytest.mark.parametrize("make", [uniform_design, cs_design], ids=["uniform", "cs"])
def test_both_designs_recover_planted_additive_utilities(make):
    design = make(N, seed=0)
    w = fit_datamodel(design, planted(design))
    assert spearmanr(w, TRUE).statistic > 0.99
    support = set(np.flatnonzero(np.abs(w) > 0.05).tolist())
    assert support == set(np.flatnonzero(TRUE).tolist())
    assert np.all(np.sign(w[TRUE != 0]) == np.sign(TRUE[TRUE != 0]))
    assert np.max(np.abs(w - TRUE)) < 0.1


def test_uniform_design_has_the_papers_budget_and_fixed_size_rows():
    d = uniform_design(N, seed=3)
    assert d.kind == "uniform" and d.rows == 10 * N and d.A.shape == (10 * N, N)
    assert set(np.unique(d.A)) == {0.0, 1.0}
    assert np.all(d.A.sum(axis=1) == round(0.5 * N))
    for r in range(d.rows):  # row r is the mask of the subset it trains
        assert tuple(np.flatnonzero(d.A[r])) == d.subsets[d.plus[r]]
    assert len(set(d.subsets)) == len(d.subsets)  # each distinct subset listed once
    assert uniform_design(N, seed=3).subsets == d.subsets  # a pure function of its arguments
    assert uniform_design(N, seed=4).subsets != d.subsets
    assert np.all(uniform_design(10, rows=7, rho=0.3).A.sum(axis=1) == 3)


def test_cs_design_is_the_achlioptas_projection_realised_by_paired_subsets():
    n = 30
    d = cs_design(n, seed=0)
    c = math.sqrt(3 / n)
    assert d.rows == 5 * n and d.c == pytest.approx(c)  # 10 N fine-tunes, two per row
    xi = np.rint(d.A / c)
    assert np.allclose(d.A, c * xi) and set(np.unique(xi)) <= {-1.0, 0.0, 1.0}
    freq = [np.mean(xi == v) for v in (1, 0, -1)]
    assert freq == pytest.approx([1 / 6, 2 / 3, 1 / 6], abs=0.03)
    for r in range(d.rows):
        assert d.subsets[d.plus[r]] == tuple(np.flatnonzero(xi[r] >= 0))  # xi in {0, +1}
        assert d.subsets[d.minus[r]] == tuple(np.flatnonzero(xi[r] <= 0))  # xi in {0, -1}
    # the response c (u(S_r1) - u(S_r2)) of an additive u with an offset is exactly A w: the offset cancels
    w = np.r_[TRUE, TRUE[:10]]
    u = np.array([5.0 + w[list(s)].sum() for s in d.subsets])
    assert np.allclose(d.responses(u), d.A @ w)


def test_lasso_is_the_papers_objective():
    rng = np.random.default_rng(0)
    A, y = rng.normal(size=(40, 6)), rng.normal(size=40)
    alpha = 3.0
    w = lasso(A, y, alpha)

    def objective(v):
        return np.sum((A @ v - y) ** 2) + alpha * np.abs(v).sum()

    for _ in range(50):  # no nearby point does better
        assert objective(w) <= objective(w + rng.normal(scale=1e-3, size=6)) + 1e-9
    assert np.allclose(lasso(A, y, alpha_max(A, y) * 1.0001), 0.0)
    assert np.allclose(lasso(A, y, 0.0), np.linalg.lstsq(A, y, rcond=None)[0])


def test_responses_refuse_the_wrong_number_of_utilities_and_utilities_are_improvements():
    d = uniform_design(5, rows=4)
    with pytest.raises(ValueError, match="one utility per design subset"):
        d.responses(np.zeros(len(d.subsets) + 1))
    assert np.allclose(utilities_from_losses([2.0, 2.5], 2.2), [0.2, -0.3])
    with pytest.raises(ValueError):
        uniform_design(1)
