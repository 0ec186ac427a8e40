"""KMM property tests: the fast solvers against the CVXPY reference and independent formulations."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kmm_oracle import scipy_budget, scipy_penalised, sklearn_penalised
from solver_helpers import example, random_gradients, random_problem

from convalue.solvers import KMMInputError, make_problem, solve_kmm


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31), n=st.integers(2, 12), p=st.integers(1, 8), dup=st.booleans(),
       log_gamma=st.floats(-3, 0))
def test_penalised_matches_independent_formulation(seed, n, p, dup, log_gamma):
    G, g = random_gradients(seed, n, p, dup)  # rank-deficient whenever n > p
    K, beta = G @ G.T, G @ g
    gamma = 10**log_gamma
    sol = solve_kmm(K, beta, gamma=gamma)
    prob = make_problem(K, beta, gamma=gamma)
    # two independent formulations: gradient-space Lasso (coordinate descent) and split-variable L-BFGS-B
    ref = min(prob.objective(sklearn_penalised(G, g, gamma)), prob.objective(scipy_penalised(K, beta, gamma)))
    assert abs(sol.objective - ref) <= 1e-6 * max(1.0, abs(ref))


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31), n=st.integers(2, 10), p=st.integers(1, 6), dup=st.booleans(),
       budget=st.floats(0.05, 3.0))
def test_budget_matches_independent_formulation(seed, n, p, dup, budget):
    K, beta = random_problem(seed, n, p, dup)
    sol = solve_kmm(K, beta, budget=budget)
    assert np.abs(sol.w).sum() <= budget * (1 + 1e-6)
    prob = make_problem(K, beta, budget=budget)
    ref = prob.objective(scipy_budget(K, beta, budget))
    assert sol.objective <= ref + 1e-6 * max(1.0, abs(ref))


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31), n=st.integers(2, 14), p=st.integers(1, 10), dup=st.booleans(),
       log_gamma=st.floats(-4, 0))
def test_active_set_matches_reference(seed, n, p, dup, log_gamma):
    K, beta = random_problem(seed, n, p, dup)  # rank-deficient whenever n > p
    gamma = 10**log_gamma
    fast = solve_kmm(K, beta, gamma=gamma, method="active_set")
    ref = solve_kmm(K, beta, gamma=gamma, method="cvxpy")
    assert fast.status == "optimal" and fast.kkt <= 1e-6 * max(1.0, float(np.abs(beta).max()))
    assert fast.objective <= ref.objective + 1e-6 * max(1.0, abs(ref.objective))


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31), n=st.integers(2, 12), p=st.integers(1, 8), dup=st.booleans(),
       budget=st.floats(0.05, 3.0), priced=st.booleans())
def test_budget_and_cost_budget_match_reference(seed, n, p, dup, budget, priced):
    K, beta = random_problem(seed, n, p, dup)
    costs = np.random.default_rng(seed).uniform(0.5, 3.0, size=n) if priced else None
    fast = solve_kmm(K, beta, budget=budget, costs=costs)
    ref = solve_kmm(K, beta, budget=budget, costs=costs, method="cvxpy")
    spent = float(np.abs(fast.w).sum() if costs is None else (costs * np.abs(fast.w)).sum())
    assert spent <= budget * (1 + 1e-6)
    assert fast.objective <= ref.objective + 1e-6 * max(1.0, abs(ref.objective))
    assert fast.form == ("cost_budget" if priced else "budget")


def test_gradient_space_solver_matches_gram_solver():
    from convalue.solvers import solve_kmm_gradients

    rng = np.random.default_rng(11)
    G = rng.normal(size=(40, 15))  # N > p: rank-deficient K
    g = rng.normal(size=15)
    for kw in ({"gamma": 0.5}, {"gamma": 0.02}, {"budget": 2.0}):
        a = solve_kmm_gradients(G, g, **kw)
        b = solve_kmm(G @ G.T, G @ g, **kw, method="cvxpy")
        assert a.status == "optimal"
        assert a.objective <= b.objective + 1e-6 * max(1.0, abs(b.objective)), kw
    G = G * rng.uniform(0.2, 5.0, size=(40, 1))  # unequal norms: cosine normalisation matters
    a = solve_kmm_gradients(G, g, gamma=0.05, normalize="cosine")
    b = solve_kmm(G @ G.T, G @ g, gamma=0.05, normalize="cosine", method="cvxpy")
    assert a.objective <= b.objective + 1e-6 * max(1.0, abs(b.objective))
    with pytest.raises(KMMInputError, match="normalize must be"):
        solve_kmm_gradients(G, g, gamma=0.05, normalize="l2")


def test_reference_paper_setting_runs():
    K, beta = example()
    sol = solve_kmm(K, beta, gamma=1e-3, method="cvxpy_paper")
    assert sol.method == "cvxpy-osqp-paper" and sol.w.shape == (3,)


def test_the_reference_without_cvxpy_names_the_extra(monkeypatch):
    """Without the `reference` extra, method cvxpy says what to install; the exact solver does not need it."""
    import sys

    from convalue.solvers import KMMSolveError

    monkeypatch.setitem(sys.modules, "cvxpy", None)  # what `import cvxpy` sees where it is not installed
    K, beta = np.array([[2.0, 0.5], [0.5, 1.0]]), np.array([1.0, 0.2])
    with pytest.raises(KMMSolveError, match=r"pip install 'convalue\[reference\]'"):
        solve_kmm(K, beta, gamma=0.1, method="cvxpy")
    assert solve_kmm(K, beta, gamma=0.1).kkt < 1e-9
