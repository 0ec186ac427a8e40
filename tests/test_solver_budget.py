"""KMM budget form and costs: prices, homotopy breakpoints, working sets, the gamma grid."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kmm_oracle import scipy_budget
from solver_helpers import (
    _assert_far_from_a_support_change,
    _clustered,
    example,
    random_gradients,
    random_problem,
)

from convalue.solvers import DEFAULT_POLICY, KMMInputError, kkt_violation, make_problem, solve_kmm


def test_costs_change_the_choice():
    K, beta = example()
    cheap3 = solve_kmm(K, beta, budget=0.5, costs=np.array([1.0, 1.0, 0.1]))
    dear3 = solve_kmm(K, beta, budget=0.5, costs=np.array([1.0, 1.0, 10.0]))
    assert cheap3.w[2] > 0.5 and abs(dear3.w[2]) < abs(cheap3.w[2])
    with pytest.raises(KMMInputError, match="costs must be finite and > 0"):
        solve_kmm(K, beta, budget=1.0, costs=np.array([1.0, 0.0, 1.0]))


def test_gradient_space_solver_with_prices_and_bad_settings():
    from convalue.solvers import solve_kmm_gradients

    rng = np.random.default_rng(12)
    G, g = rng.normal(size=(20, 8)), rng.normal(size=8)
    costs = rng.uniform(0.5, 2.0, size=20)
    a = solve_kmm_gradients(G, g, budget=1.0, costs=costs)
    b = solve_kmm(G @ G.T, G @ g, budget=1.0, costs=costs, method="cvxpy")
    assert a.form == "cost_budget" and (costs * np.abs(a.w)).sum() <= 1.0 + 1e-6
    assert a.objective <= b.objective + 1e-6 * max(1.0, abs(b.objective))
    with pytest.raises(KMMInputError, match="gamma must be a finite number >= 0"):
        solve_kmm_gradients(G, g, gamma=-1.0)
    with pytest.raises(KMMInputError, match="costs must be finite and > 0"):
        solve_kmm_gradients(G, g, budget=1.0, costs=-costs)
    with pytest.raises(KMMInputError, match=r"g_tar contains NaN or inf: g_tar\[2\] = nan"):
        solve_kmm_gradients(G, np.where(np.arange(8) == 2, np.nan, g), gamma=0.1)
    G[3] = 0.0
    with pytest.raises(KMMInputError, match="zero-norm gradient"):
        solve_kmm_gradients(G, g, gamma=0.1)


def test_budget_past_the_homotopy_limit_warm_starts_admm_before_pdas_at_dense_gammas():
    """Clustered N = 3000 > p = 1000 (past the full homotopy's work limit), a budget met at 0.7 % of max|beta| (349
    active): the plan reads it off a working set before the gamma grid, whose warm-started solves put ADMM before
    warm PDAS at dense gammas (convalue.solvers.plan). The working set answers (the optimum is far from a change of
    support, so its LARS is exact on any BLAS), both forms agree, and the grid alone agrees with them."""
    from convalue.solvers import solve_kmm_gradients

    G, g = _clustered(3000, 1000, seed=0)
    K, beta = G @ G.T, G @ g
    grad = solve_kmm_gradients(G, g, budget=3.87)
    gram = solve_kmm(K, beta, budget=3.87, rank_bound=1000)
    _assert_far_from_a_support_change(K, beta, gram.info["gamma"], gram.w)
    for sol in (grad, gram):
        assert sol.status == "optimal" and sol.kkt <= 1e-9 and np.abs(sol.w).sum() <= 3.87 * (1 + 1e-9)
        assert sol.info["plan"] == ("working_set", "gamma_grid") and sol.info["strategy"] == "working_set_homotopy"
    assert grad.objective == pytest.approx(gram.objective, rel=1e-9, abs=1e-12)
    grid = solve_kmm(K, beta, budget=3.87, rank_bound=1000, policy=DEFAULT_POLICY.but(budget={"working_set_max": 0}))
    assert grid.info["plan"] == ("gamma_grid",) and grid.info["strategy"] == "gamma_grid"
    assert grid.kkt <= 1e-9 and grid.objective == pytest.approx(gram.objective, rel=1e-9)


def test_gradient_form_budget_with_n_at_most_p_forms_the_gram_once_the_grid_is_dense():
    """solve_budget's gamma grid in the gradient form with N <= p forms K = G G^T when it first reaches a dense gamma
    (as the penalised form does), not for a sparse budget; both agree with the Gram form and the reference."""
    from convalue.solvers import solve_kmm_gradients

    G, g = _clustered(200, 300, seed=5)
    K, beta = G @ G.T, G @ g
    gmax = float(np.abs(beta).max())
    for ratio, formed in ((0.003, True), (0.1, False)):
        budget = float(np.abs(solve_kmm(K, beta, gamma=ratio * gmax).w).sum())
        grad = solve_kmm_gradients(G, g, budget=budget)
        # full rank and N below the working set's N: the grid is the whole plan
        assert grad.info["plan"] == ("gamma_grid",) and bool(grad.info.get("gram_formed")) is formed
        assert grad.summary().get("gram_formed", False) is formed
        assert grad.status == "optimal" and grad.kkt <= 1e-9 and np.abs(grad.w).sum() <= budget * (1 + 1e-9)
        ref = solve_kmm(K, beta, budget=budget, method="cvxpy")
        assert grad.objective <= ref.objective + 1e-9 * max(1.0, abs(ref.objective))
        assert grad.objective == pytest.approx(solve_kmm(K, beta, budget=budget).objective, rel=1e-9, abs=1e-12)


def test_budget_past_the_full_homotopy_is_read_off_a_working_set_exactly():
    """N > p past the full homotopy's work limit (homotopy.max_work 0 here): the budget is read off the homotopy's
    path on a working set, exactly, in both forms (each optimum far from a change of support: its LARS is exact on
    any BLAS); with the working set off, or capped below what it needs, the gamma grid answers the same."""
    from convalue.solvers import solve_kmm_gradients

    policy = DEFAULT_POLICY.but(homotopy={"max_work": 0.0})
    G, g = _clustered(400, 60, seed=6)
    K, beta = G @ G.T, G @ g
    gmax = float(np.abs(beta).max())
    for ratio in (0.05, 0.005):
        budget = 0.9 * float(np.abs(solve_kmm(K, beta, gamma=ratio * gmax, rank_bound=60).w).sum())
        sol = solve_kmm(K, beta, budget=budget, rank_bound=60, policy=policy)
        grad = solve_kmm_gradients(G, g, budget=budget, policy=policy)
        _assert_far_from_a_support_change(K, beta, sol.info["gamma"], sol.w)
        for s in (sol, grad):
            assert s.info["strategy"] == "working_set_homotopy" and s.info["binding"]
            assert s.status == "optimal" and s.kkt <= 1e-9
            assert np.abs(s.w).sum() == pytest.approx(budget, rel=1e-9)
        ref = solve_kmm(K, beta, budget=budget, method="cvxpy")
        assert sol.objective <= ref.objective + 1e-9 * max(1.0, abs(ref.objective))
        assert grad.objective == pytest.approx(sol.objective, rel=1e-9, abs=1e-12)
        for cap in (0, 16):  # off; and a W smaller than the 23 and 52 active, where it gives up
            grid = solve_kmm(K, beta, budget=budget, rank_bound=60, policy=policy.but(budget={"working_set_max": cap}))
            assert grid.info["strategy"] == "gamma_grid" and grid.kkt <= 1e-9
            assert grid.objective == pytest.approx(sol.objective, rel=1e-9, abs=1e-12)
    # a priced budget (sum_i c_i |w_i| <= B) runs the same way on the unit-cost problem in v = c * w
    costs = np.random.default_rng(7).uniform(0.5, 2.0, size=len(beta))
    priced = solve_kmm(K, beta, budget=1.5, costs=costs, rank_bound=60, policy=policy)
    _assert_far_from_a_support_change(K / np.outer(costs, costs), beta / costs, priced.info["gamma"], priced.w * costs)
    assert priced.info["strategy"] == "working_set_homotopy" and priced.kkt <= 1e-9
    assert (costs * np.abs(priced.w)).sum() == pytest.approx(1.5, rel=1e-9)
    ref = solve_kmm(K, beta, budget=1.5, costs=costs, method="cvxpy")
    assert priced.objective <= ref.objective + 1e-9 * max(1.0, abs(ref.objective))


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31), n=st.integers(2, 14), p=st.integers(1, 6), dup=st.booleans(),
       budget=st.floats(0.05, 3.0))
def test_working_set_budget_certifies_every_binding_budget(seed, n, p, dup, budget):
    """The budget form on a working set from two candidates (duplicates and N > p included): where the budget binds
    it certifies, spends the budget and matches the independent formulation; where it gives up, the budget does not
    bind."""
    from convalue.solvers.operators import GramOperator
    from convalue.solvers.working_set import working_set_budget

    K, beta = random_problem(seed, n, p, dup)
    gmax = float(np.abs(beta).max())
    w, gamma, _, ok = working_set_budget(GramOperator(K, beta, rank=min(n, p)), budget, 1e-10 * max(1.0, gmax),
                                         policy=DEFAULT_POLICY, start=2)
    binding = solve_kmm(K, beta, budget=budget).info["binding"]
    assert ok == binding
    if ok:
        assert np.abs(w).sum() == pytest.approx(budget, rel=1e-9) and 0 < gamma <= gmax
        prob = make_problem(K, beta, gamma=gamma)
        assert kkt_violation(prob, w) <= 1e-8 * max(1.0, gmax)
        ref = make_problem(K, beta, budget=budget)
        assert ref.objective(w) <= ref.objective(scipy_budget(K, beta, budget)) + 1e-6 * max(1.0, gmax)


def test_budget_reads_the_homotopy_breakpoints_exactly():
    G, g = random_gradients(4, 120, 30, False)
    K, beta = G @ G.T, G @ g
    for budget in (0.3, 2.0, 6.0):
        sol = solve_kmm(K, beta, budget=budget)
        assert sol.info["plan"][0] == "homotopy"
        ref = make_problem(K, beta, budget=budget).objective(scipy_budget(K, beta, budget))
        assert sol.objective <= ref + 1e-7 * max(1.0, abs(ref))
        if sol.info["binding"]:
            assert np.abs(sol.w).sum() == pytest.approx(budget, rel=1e-12)
            assert sol.kkt <= 1e-9
    loose = solve_kmm(K, beta, budget=1e6)  # never binds: the min-l1 exact match, gamma -> 0
    assert not loose.info["binding"] and loose.kkt <= 1e-9
