"""The paper's worked example and basic properties of the KMM solution and its KKT certificate."""

from __future__ import annotations

import numpy as np
import pytest
from kmm_oracle import scipy_budget
from solver_helpers import G_EX, G_TAR, example

from convalue.engine.selection.select import select_top_k
from convalue.solvers import kkt_violation, make_problem, solve_kmm


def test_paper_example_penalised_matches_closed_form():
    K, beta = example()
    gamma = 1e-3
    sol = solve_kmm(K, beta, gamma=gamma)
    assert sol.status == "optimal" and sol.kkt < 1e-7
    # objective depends on g1, g2 only through a = w1 + w2: stationarity gives a = 1 - 0.9 gamma, w3 = 0.9 - 0.91 gamma
    assert sol.w[0] + sol.w[1] == pytest.approx(1 - 0.9 * gamma, abs=1e-6)
    assert sol.w[2] == pytest.approx(0.9 - 0.91 * gamma, abs=1e-6)
    assert min(sol.w[:2]) >= -1e-9  # no cancelling pair: that would cost l1 for nothing


def test_paper_example_kmm_avoids_the_redundant_pair():
    K, beta = example()
    assert beta[0] == beta[1] > beta[2]  # alignment alone picks the two identical gradients
    sol = solve_kmm(K, beta, gamma=1e-3)
    top2 = select_top_k(sol.w, beta, 2)
    assert 2 in top2 and len({0, 1} & set(top2)) == 1
    # w* = (1, 0, 0.9) reaches zero matching error: same objective as the solver's
    ref = np.array([1 - 0.9e-3, 0.0, 0.9 - 0.91e-3])
    assert sol.objective == pytest.approx(make_problem(K, beta, gamma=1e-3).objective(ref), abs=1e-9)


def test_paper_example_budget_form():
    K, beta = example()
    loose = solve_kmm(K, beta, budget=5.0)  # not binding: exact matching, ||w||_1 = 1.9
    assert np.abs(loose.w).sum() == pytest.approx(1.9, abs=1e-5)
    assert (G_EX.T @ loose.w) == pytest.approx(G_TAR, abs=1e-5)
    tight = solve_kmm(K, beta, budget=1.0)
    assert np.abs(tight.w).sum() <= 1.0 + 1e-6
    assert tight.kkt < 1e-6
    ref = scipy_budget(K, beta, 1.0)
    prob = make_problem(K, beta, budget=1.0)
    assert tight.objective <= prob.objective(ref) + 1e-7


def test_gamma_at_or_above_max_beta_gives_zero():
    rng = np.random.default_rng(0)
    G = rng.normal(size=(6, 4))
    K, beta = G @ G.T, G @ rng.normal(size=4)
    sol = solve_kmm(K, beta, gamma=float(np.abs(beta).max()) * 1.0001)
    assert np.abs(sol.w).max() < 1e-7


def test_cosine_normalisation_is_scale_free():
    rng = np.random.default_rng(1)
    G = rng.normal(size=(5, 7))
    g = rng.normal(size=7)
    scaled = G * np.array([[1.0], [10.0], [0.1], [3.0], [1.0]])
    a = solve_kmm(G @ G.T, G @ g, gamma=0.05, normalize="cosine")
    b = solve_kmm(scaled @ scaled.T, scaled @ g, gamma=0.05, normalize="cosine")
    assert a.w == pytest.approx(b.w, abs=1e-6)


def test_kkt_detects_a_wrong_solution():
    K, beta = example()
    prob = make_problem(K, beta, gamma=1e-3)
    sol = solve_kmm(K, beta, gamma=1e-3)
    assert kkt_violation(prob, sol.w) < 1e-7
    assert kkt_violation(prob, sol.w + np.array([0.1, 0, 0])) > 1e-2
