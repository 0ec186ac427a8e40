"""KMM penalised strategies for sparse solutions: the working set, its probe, PDAS."""

from __future__ import annotations

import numpy as np
import pytest
from kmm_oracle import scipy_penalised
from solver_helpers import _assert_far_from_a_support_change, _clustered, _near_parallel, _recorded

from convalue.solvers import DEFAULT_POLICY, kkt_violation, make_problem, solve_kmm


def test_a_dense_gamma_with_a_sparse_solution_is_certified_by_the_working_set_probe():
    """Near-parallel gradients, N = 3000 > p = 1000 (past the full homotopy's work limit), gamma = 1e-3 max|beta|:
    dense by the ratio, 5 candidates active. The plan puts the working-set probe first (K is rank-deficient; on a
    full-rank K from probe_min_n candidates), and the probe certifies in both forms: the optimum is far from a change
    of support (checked), so LARS on the probe's few candidates is exact on any BLAS."""
    from convalue.solvers import solve_kmm_gradients
    from convalue.solvers.homotopy import affordable
    from convalue.solvers.operators import GramOperator

    rng = np.random.default_rng(31)
    G, g = _near_parallel(rng, 3000, 1000)
    K, beta = G @ G.T, G @ g
    gamma = 1e-3 * float(np.abs(beta).max())
    assert not affordable(GramOperator(K, beta, rank=1000), DEFAULT_POLICY)
    gram = solve_kmm(K, beta, gamma=gamma, rank_bound=1000)
    grad = solve_kmm_gradients(G, g, gamma=gamma)
    _assert_far_from_a_support_change(K, beta, gamma, gram.w)
    for sol in (gram, grad):
        assert sol.info["plan"][0] == sol.info["step"] == "probe" and sol.info["fallback"] is None
        assert sol.kkt <= 1e-10 and 0 < np.count_nonzero(sol.w) <= DEFAULT_POLICY.plan.probe_max
    assert grad.objective == pytest.approx(gram.objective, rel=1e-9, abs=1e-12)
    np.testing.assert_allclose(grad.w, gram.w, rtol=0, atol=1e-8)
    # the budget form's warm-started gamma grid starts with the working set too
    budget = 0.5 * float(np.abs(gram.w).sum())
    for sol in (solve_kmm_gradients(G, g, budget=budget), solve_kmm(K, beta, budget=budget, rank_bound=1000)):
        assert sol.status == "optimal" and sol.kkt <= 1e-9 and np.abs(sol.w).sum() <= budget * (1 + 1e-9)
    # a full-rank K of N = 2000 (p = 2200): the probe first there too; below probe_min_n ADMM's first steps go first
    G, g = _near_parallel(rng, 2000, 2200)
    K, beta = G @ G.T, G @ g
    gamma = 1e-3 * float(np.abs(beta).max())
    full = solve_kmm(K, beta, gamma=gamma)
    _assert_far_from_a_support_change(K, beta, gamma, full.w)
    assert full.info["plan"][0] == full.info["step"] == "probe" and full.kkt <= 1e-10
    small = solve_kmm(K[:600, :600], beta[:600], gamma=gamma)
    assert small.info["plan"][0] == "admm_first" and small.kkt <= 1e-10
    assert small.objective == pytest.approx(solve_kmm(K[:600, :600], beta[:600], gamma=gamma,
                                                      method="cvxpy").objective, rel=1e-8, abs=1e-12)


def test_dense_gamma_with_a_hundred_active_takes_the_working_set_after_admm_first_steps():
    """Near-parallel gradients, the target a mix of 60 of them, gamma = 1e-3 max|beta| (dense by its ratio): about
    100 candidates are active, past the probe's cap (which does not run at this N either), where ADMM crawls: the plan
    puts the wide working set, seeded by ADMM's first steps, before ADMM in full, and the answer is exact."""
    rng = np.random.default_rng(41)
    G, g = _near_parallel(rng, 400, 800, 60)
    K, beta = G @ G.T, G @ g
    gamma = 1e-3 * float(np.abs(beta).max())
    sol = solve_kmm(K, beta, gamma=gamma)
    assert sol.info["plan"][:3] == ("admm_first", "seeded_wide_working_set", "admm")
    assert sol.kkt <= 1e-10 * max(1.0, float(np.abs(beta).max())) and np.count_nonzero(sol.w) > 64
    ref = solve_kmm(K, beta, gamma=gamma, method="cvxpy")
    assert sol.objective <= ref.objective + 1e-9 * max(1.0, abs(ref.objective))


def test_the_working_set_after_admm_first_steps_starts_from_their_iterate(monkeypatch):
    """The wide working set starts from ADMM's first iterate where K is formed (plan.wide_seeded): seeded by the
    optimum's support it solves in one LARS run where it grows from the largest |beta| in several; the seeded step
    hands over that iterate, the unseeded one none; the plan seeds only where K is formed, and the answer is the same
    with the seed and without it."""
    import convalue.solvers.penalised as penalised_module
    import convalue.solvers.working_set as WS
    from convalue.solvers.operators import GradientOperator, GramOperator

    G, g = _near_parallel(np.random.default_rng(41), 400, 800, 60)
    K, beta = G @ G.T, G @ g
    gmax = float(np.abs(beta).max())
    gamma = 1e-3 * gmax
    exact = solve_kmm(K, beta, gamma=gamma)
    support = np.flatnonzero(exact.w)
    runs: list[int] = []
    monkeypatch.setattr(WS, "lars", _recorded(WS.lars, runs, lambda sub, *a, **k: sub.n))
    op = GramOperator(K, beta)
    # W holds the optimum's support from the start: exact on W, no violator outside it, one run
    w, _, ok = WS.working_set_homotopy(op, gamma, 1e-10 * gmax, policy=DEFAULT_POLICY, max_size=400, seed=exact.w)
    assert ok and len(runs) == 1 and runs[0] >= support.size  # the seed's nonzeros joined the first W
    assert kkt_violation(make_problem(K, beta, gamma=gamma), w) <= 1e-10 * gmax
    runs.clear()
    w, _, ok = WS.working_set_homotopy(op, gamma, 1e-10 * gmax, policy=DEFAULT_POLICY, max_size=400)
    assert ok and len(runs) > 1 and runs[0] == DEFAULT_POLICY.working_set.start
    runs.clear()
    WS.working_set_homotopy(op, gamma, 1e-10 * gmax, policy=DEFAULT_POLICY, max_size=50, seed=exact.w)
    assert runs[0] == 50  # the seed fills the first W up to the cap, largest |w| first

    seeds: list[object] = []
    monkeypatch.setattr(WS, "working_set_homotopy", lambda *a, seed=None, **k: seeds.append(seed) or (w, 0, False))
    steps = penalised_module._Steps(op, gamma, DEFAULT_POLICY, 1e-10 * gmax, None, None, None, 0.25, 200)
    steps.first_iterate = exact.w
    steps.run("seeded_wide_working_set")
    steps.run("wide_working_set")
    assert seeds[0] is exact.w and seeds[1] is None
    unseeded_policy = DEFAULT_POLICY.but(plan={"wide_seeded": False})
    facts = penalised_module.facts_of(op, gamma)
    gradient_facts = penalised_module.facts_of(GradientOperator(G, g), gamma)
    assert "seeded_wide_working_set" in penalised_module.plan_penalised(facts, DEFAULT_POLICY)
    assert "seeded_wide_working_set" not in penalised_module.plan_penalised(facts, unseeded_policy)
    assert "seeded_wide_working_set" not in penalised_module.plan_penalised(gradient_facts, DEFAULT_POLICY)
    monkeypatch.undo()
    unseeded = solve_kmm(K, beta, gamma=gamma, policy=unseeded_policy)
    assert unseeded.kkt <= 1e-10 * gmax and exact.kkt <= 1e-10 * gmax
    assert exact.objective == pytest.approx(unseeded.objective, rel=1e-9, abs=1e-12)


def test_plain_pdas_stops_when_its_objective_climbs_and_returns_its_best_iterate():
    """Straight at a small gamma on clustered gradients, PDAS's objective climbs while its supports grow; with the
    divergence stop it ends after the first two rises in a row, where without it it runs on until a cycle. Both runs
    do the same arithmetic up to the stop, so the stop is checked against the unstopped run's own objectives."""
    from convalue.solvers.active_set import objective_at, pdas_plain, residual
    from convalue.solvers.operators import GramOperator

    class Recording(GramOperator):
        """Records the objective at every support solve's iterate."""

        def solve_support_residual(self, A, rhs):
            x, r = super().solve_support_residual(A, rhs)
            w = np.zeros(self.n)
            w[A] = x
            self.objectives.append(objective_at(w, r, self.beta, gamma))
            return x, r

    G, g = _clustered(200, 1000, seed=0)
    op = Recording(G @ G.T, G @ g)
    gamma = 0.02 * float(np.abs(op.beta).max())
    scale = 1e-10 * max(1.0, float(np.abs(op.beta).max()))
    op.objectives = [0.0]  # the objective at w = 0
    w, solves, ok = pdas_plain(op, gamma, np.zeros(op.n), 15, scale)
    stopped = op.objectives
    op.objectives = [0.0]
    _, solves_all, ok_all = pdas_plain(op, gamma, np.zeros(op.n), 15, scale, diverging=None)
    f = op.objectives
    assert not ok and not ok_all and stopped == f[:len(stopped)]
    first_two_rises = next(t for t in range(2, len(f)) if f[t] > f[t - 1] > f[t - 2])
    assert solves == first_two_rises < solves_all
    assert objective_at(w, residual(op, w), op.beta, gamma) == min(stopped) < 0.0  # the best iterate, below w = 0
    sol = solve_kmm(G @ G.T, G @ g, gamma=gamma)  # the plan goes on to an exact solution
    assert sol.status == "optimal" and sol.kkt <= 1e-10 * max(1.0, float(np.abs(op.beta).max()))


@pytest.mark.parametrize("n, p", [(240, 600), (400, 120)])  # N < p, and N > p (K of rank p)
def test_sparse_gradient_space_solves_take_the_working_set_homotopy_and_are_exact(n, p):
    """The gradient form at a sparse gamma plans the working set first (a support of s costs s^2 p to form), which
    answers exactly (each optimum far from a change of support: its LARS is exact on any BLAS)."""
    from convalue.solvers import solve_kmm_gradients

    policy = DEFAULT_POLICY.but(homotopy={"max_work": 0.0})  # N > p at a size beyond the full homotopy
    G, g = _clustered(n, p, seed=1)
    gamma = 0.02 * float(np.abs(G @ g).max())
    grad = solve_kmm_gradients(G, g, gamma=gamma, policy=policy)
    _assert_far_from_a_support_change(G @ G.T, G @ g, gamma, grad.w)
    assert grad.info["plan"][0] == grad.info["step"] == "working_set" and grad.info["fallback"] is None
    assert grad.kkt <= 1e-10 * max(1.0, float(np.abs(G @ g).max()))
    ref = solve_kmm(G @ G.T, G @ g, gamma=gamma, method="cvxpy")
    assert grad.objective <= ref.objective + 1e-9 * max(1.0, abs(ref.objective))
    assert grad.objective == pytest.approx(solve_kmm(G @ G.T, G @ g, gamma=gamma).objective, rel=1e-9, abs=1e-12)


def test_gradient_space_solves_copy_g_once_and_scale_in_place_only_when_allowed():
    """solve_kmm_gradients with the cosine leaves the caller's G alone (one float64 copy, also from float32 rows);
    with overwrite_G the rows are normalised in place; the certified answer is the same every way."""
    from convalue.solvers import solve_kmm_gradients

    G, g = _clustered(300, 200, seed=3)
    G = 2.5 * G  # rows of norm 2.5, so the cosine changes them
    gamma = 0.05 * float(np.abs(G @ g).max())
    kept = G.copy()
    plain = solve_kmm_gradients(G, g, gamma=gamma, normalize="cosine")
    assert np.array_equal(G, kept)
    from32 = solve_kmm_gradients(G.astype(np.float32), g, gamma=gamma, normalize="cosine")
    mine = np.array(G, order="C")
    inplace = solve_kmm_gradients(mine, g, gamma=gamma, normalize="cosine", overwrite_G=True)
    np.testing.assert_allclose(np.linalg.norm(mine, axis=1), 1.0, rtol=1e-12)
    for sol in (plain, from32, inplace):
        assert sol.status == "optimal" and sol.kkt <= 1e-10
    assert inplace.objective == pytest.approx(plain.objective, rel=1e-12, abs=1e-15)
    assert from32.objective == pytest.approx(plain.objective, rel=1e-5)
    readonly = G.copy()
    readonly.flags.writeable = False  # e.g. an array handed over by Ray's object store: copied, not written
    assert solve_kmm_gradients(readonly, g, gamma=gamma, normalize="cosine", overwrite_G=True).objective == \
        pytest.approx(plain.objective, rel=1e-12, abs=1e-15)


def test_working_set_homotopy_on_a_gram_beyond_the_full_homotopy_handles_duplicates():
    """N > p where the full homotopy is not affordable (so no duplicate search ran first): the working set goes
    first, drops exact copies inside W before LARS, and is exact (the optimum is far from a change of support among
    distinct candidates); the weight of a duplicate pair sits on one copy."""
    policy = DEFAULT_POLICY.but(homotopy={"max_work": 0.0})
    G, g = _clustered(300, 80, seed=3)
    gamma = 0.03 * float(np.abs(G @ g).max())
    distinct = solve_kmm(G @ G.T, G @ g, gamma=gamma)
    _assert_far_from_a_support_change(G @ G.T, G @ g, gamma, distinct.w)
    chosen = np.argsort(-np.abs(distinct.w))[:10]  # ten of the support
    G = np.vstack([G, G[chosen]])  # and an exact copy of each
    K, beta = G @ G.T, G @ g
    sol = solve_kmm(K, beta, gamma=gamma, policy=policy)
    assert sol.info["plan"][0] == sol.info["step"] == "working_set" and sol.info["fallback"] is None
    assert sol.kkt <= 1e-10 * max(1.0, float(np.abs(beta).max()))
    ref = make_problem(K, beta, gamma=gamma).objective(scipy_penalised(K, beta, gamma))
    assert sol.objective <= ref + 1e-9 * max(1.0, abs(ref))
    assert np.count_nonzero(sol.w[chosen] * sol.w[300:]) == 0  # never both copies of a pair


def test_rank_deficient_sparse_solves_of_many_candidates_take_the_working_set_first():
    """An affordable N > p problem: the plan puts the working set before the full homotopy from
    plan.working_set_first_min_n candidates (300 here) and plan.working_set_first_ratio max|beta| up; below either,
    the homotopy first. Either way the answer is exact."""
    G, g = _clustered(400, 60, seed=4)
    K, beta = G @ G.T, G @ g
    gmax = float(np.abs(beta).max())
    policy = DEFAULT_POLICY.but(plan={"working_set_first_min_n": 300})
    for ratio, first in ((0.1, "working_set"), (0.5 * policy.plan.working_set_first_ratio, "homotopy")):
        gamma = ratio * gmax
        sol = solve_kmm(K, beta, gamma=gamma, policy=policy)
        assert sol.info["plan"][0] == first and sol.kkt <= 1e-10 * max(1.0, gmax)
        ref = make_problem(K, beta, gamma=gamma).objective(scipy_penalised(K, beta, gamma))
        assert sol.objective <= ref + 1e-9 * max(1.0, abs(ref))
    later = policy.but(plan={"working_set_first_min_n": 401})
    assert solve_kmm(K, beta, gamma=0.1 * gmax, policy=later).info["plan"][0] == "homotopy"


def test_working_set_homotopy_gives_up_at_its_cap_and_the_chain_goes_on():
    """A working set capped below the optimum's support gives up (it cannot hold it), and the plan's next steps
    answer the same optimum."""
    import convalue.solvers.working_set as WS
    from convalue.solvers import solve_kmm_gradients
    from convalue.solvers.operators import GradientOperator

    G, g = _clustered(240, 600, seed=1)
    gamma = 0.02 * float(np.abs(G @ g).max())
    full = solve_kmm_gradients(G, g, gamma=gamma)
    assert np.count_nonzero(full.w) > 16
    small = DEFAULT_POLICY.but(working_set={"start": 8, "max_size": 16})  # smaller than the support
    op = GradientOperator(G, g)
    w, steps, ok = WS.working_set_homotopy(op, gamma, 1e-10, policy=small)
    assert not ok and np.count_nonzero(w) <= 16
    capped = solve_kmm_gradients(G, g, gamma=gamma, policy=small)
    assert capped.status == "optimal" and capped.info["step"] != "working_set"
    assert capped.objective == pytest.approx(full.objective, rel=1e-9, abs=1e-12)
