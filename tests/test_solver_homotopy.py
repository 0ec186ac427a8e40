"""KMM penalised strategies on rank-deficient K: the homotopy, its fallbacks, duplicates."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kmm_oracle import scipy_penalised
from solver_helpers import _assert_far_from_a_support_change, _near_parallel, random_gradients

from convalue.solvers import DEFAULT_POLICY, kkt_violation, make_problem, solve_kmm


@pytest.mark.parametrize("gamma_ratio", [3e-2, 3e-4, 3e-6])
def test_n_above_p_takes_the_homotopy_and_is_exact(gamma_ratio):
    """N = 300 > p = 100 down to small gamma: supports beyond the rank are singular, so the plan starts with the
    homotopy; the answer is exact, with at most p candidates active (Gaussian G: the optimum is unique), in both
    forms."""
    from convalue.solvers import solve_kmm_gradients

    G, g = random_gradients(0, 300, 100, False)
    K, beta = G @ G.T, G @ g
    gamma = gamma_ratio * float(np.abs(beta).max())
    sol = solve_kmm(K, beta, gamma=gamma)
    assert sol.info["plan"][0] == "homotopy"
    assert sol.kkt <= 1e-10 * max(1.0, float(np.abs(beta).max()))
    assert np.count_nonzero(sol.w) <= 100  # no support beyond the rank
    ref = make_problem(K, beta, gamma=gamma).objective(scipy_penalised(K, beta, gamma))  # an independent formulation
    assert sol.objective <= ref + 1e-9 * max(1.0, abs(ref))
    grad = solve_kmm_gradients(G, g, gamma=gamma)
    assert grad.info["plan"][0] == "homotopy" and grad.kkt <= 1e-10 * max(1.0, float(np.abs(beta).max()))
    assert grad.objective == pytest.approx(sol.objective, rel=1e-9, abs=1e-12)


def test_gradient_form_homotopy_falls_back_to_the_gram_form_when_its_lars_ends_off_the_path(monkeypatch):
    """In the gradient form scikit-learn's LARS runs on X = G^T, which can end off the path by round-off; where its
    point does not certify, LARS runs again on K = G G^T formed once (up to homotopy.gram_max_n), which is exact.
    The real case (N = 1000 > p = 200, 50 clusters of 20, gamma = 1e-3 max|beta|) is exact whichever LARS answers;
    the fallback itself is forced by handing the X form's point 1 % off the path."""
    import convalue.solvers.penalised as penalised_module
    from convalue.solvers import solve_kmm_gradients
    from convalue.solvers.operators import GradientOperator

    rng = np.random.default_rng(0)
    centers = rng.normal(size=(50, 200))
    G = centers[np.repeat(np.arange(50), 20)] + 0.35 * rng.normal(size=(1000, 200))
    G /= np.linalg.norm(G, axis=1, keepdims=True)
    g = centers[:3].sum(axis=0) / np.linalg.norm(centers[:3].sum(axis=0))
    K, beta = G @ G.T, G @ g
    gamma = 1e-3 * float(np.abs(beta).max())
    sol = solve_kmm_gradients(G, g, gamma=gamma)
    assert sol.info["plan"][0] == "homotopy" and sol.kkt <= 1e-10
    ref = solve_kmm(K, beta, gamma=gamma)
    assert sol.objective == pytest.approx(ref.objective, rel=1e-9, abs=1e-12)
    assert "gram_formed" not in sol.info  # N > p: K would be larger than G

    real = penalised_module.lars

    def off_in_x_form(op, gamma_min, *, return_path):
        gammas, W, steps = real(op, gamma_min, return_path=return_path)
        return gammas, (W * 1.01 if isinstance(op, GradientOperator) else W), steps

    monkeypatch.setattr(penalised_module, "lars", off_in_x_form)
    op, scale = GradientOperator(G, g), 1e-10 * max(1.0, float(np.abs(beta).max()))
    w, _, ok = penalised_module._homotopy(op, gamma, scale, DEFAULT_POLICY)
    assert ok and kkt_violation(make_problem(K, beta, gamma=gamma), w) <= scale
    no_gram = DEFAULT_POLICY.but(homotopy={"gram_max_n": 0})
    assert not penalised_module._homotopy(op, gamma, scale, no_gram)[2]  # without the Gram form, off the path


def test_gradient_form_with_n_at_most_p_solves_dense_gammas_on_the_gram():
    """N <= p at a dense gamma: solve_kmm_gradients forms K once and solves the Gram form (convalue.solvers.plan's
    forms_gram, a decision on N, p and gamma / max|beta| alone), with the Gram solver's answer; a sparse gamma stays
    in the gradient form."""
    from convalue.solvers import solve_kmm_gradients

    rng = np.random.default_rng(29)
    G, g = _near_parallel(rng, 300, 400)
    K, beta = G @ G.T, G @ g
    costs = rng.uniform(0.5, 2.0, size=300)
    for gamma, kw, formed in ((1e-3, {}, True), (1e-3, {"costs": costs}, True), (0.3, {}, False)):
        gamma *= float(np.abs(beta).max())
        sol = solve_kmm_gradients(G, g, gamma=gamma, **kw)
        assert sol.info.get("gram_formed", False) is formed and sol.summary().get("gram_formed", False) is formed
        ref = solve_kmm(K, beta, gamma=gamma, **kw)
        assert sol.kkt <= 1e-10 and sol.objective == pytest.approx(ref.objective, rel=1e-9, abs=1e-12)
        np.testing.assert_allclose(sol.w, ref.w, rtol=0, atol=1e-8)


def test_past_the_homotopy_limit_the_full_homotopy_follows_when_admm_and_the_working_set_give_up(monkeypatch):
    """A rank-deficient K past homotopy.max_work (0 here) but within plan.homotopy_fallback_work, where ADMM's first
    steps and the working set after them both give up (2 steps and 8 candidates here: no polish comes before step 5,
    and the optimum has 99 active): the full homotopy, on one candidate of each duplicate group, certifies before
    ADMM runs in full, seeded or not. Where ADMM's iterate has as many nonzeros as the working set's cap, so that the
    seeded working set would start full, the homotopy goes before the working set, else after it: decided at run
    time by the conditional steps (checked on their own here)."""
    import convalue.solvers.penalised as penalised_module
    from convalue.solvers import plan
    from convalue.solvers.operators import GramOperator

    G, g = _near_parallel(np.random.default_rng(43), 300, 100, 300)
    G = np.vstack([G, G[:5]])  # exact copies, which the homotopy must not see twice
    K, beta = G @ G.T, G @ g
    gamma = 1e-3 * float(np.abs(beta).max())
    # on the distinct candidates the nearest inactive one is 4e-10 (4e-7 gamma) from entering: far above LARS's
    # round-off (about 1e-13), so the homotopy certifies on any BLAS
    _assert_far_from_a_support_change(K[:300, :300], beta[:300], gamma, solve_kmm(K, beta, gamma=gamma).w[:300],
                                      margin=1e-7)
    squeezed = DEFAULT_POLICY.but(homotopy={"max_work": 0.0}, plan={"admm_first_steps": 2, "wide_max": 8})
    sols = {}
    for seeded in (False, True):
        policy = squeezed.but(plan={"wide_seeded": seeded})
        sol = sols[seeded] = solve_kmm(K, beta, gamma=gamma, rank_bound=100, policy=policy)
        homotopies = ((plan.FALLBACK_HOMOTOPY_IF_SEED_FULL, plan.FALLBACK_HOMOTOPY_UNLESS_SEED_FULL) if seeded
                      else (plan.FALLBACK_HOMOTOPY,))
        assert sol.info["step"] in homotopies and sol.info["plan"][0] == plan.PROBE
        assert sol.kkt <= 1e-10 * max(1.0, float(np.abs(beta).max())) and np.count_nonzero(sol.w) > 64
        assert np.count_nonzero(sol.w[:5] * sol.w[300:]) == 0  # never both copies of a pair
    assert sols[True].objective == pytest.approx(sols[False].objective, rel=1e-9, abs=1e-12)
    first = solve_kmm(K, beta, gamma=gamma, rank_bound=100)  # affordable: the full homotopy goes first
    assert first.info["plan"][0] == "homotopy"
    assert sols[True].objective == pytest.approx(first.objective, rel=1e-9, abs=1e-12)
    # the run-time decision: the homotopy before the working set runs only where ADMM's iterate fills its cap
    calls: list[str] = []
    monkeypatch.setattr(penalised_module, "_distinct_homotopy", lambda op, *a: calls.append("homotopy") or (
        np.zeros(op.n), 0, False))
    op = GramOperator(K, beta, rank=100)
    steps = penalised_module._Steps(op, gamma, squeezed, 1e-10, None, None, None, 0.25, 200)
    for nonzeros, before, after in ((8, "homotopy", None), (7, None, "homotopy"), (None, None, "homotopy")):
        steps.first_iterate = None if nonzeros is None else np.r_[np.ones(nonzeros), np.zeros(op.n - nonzeros)]
        calls.clear()
        assert (steps.run(plan.FALLBACK_HOMOTOPY_IF_SEED_FULL) is None) == (before is None)
        assert (steps.run(plan.FALLBACK_HOMOTOPY_UNLESS_SEED_FULL) is None) == (after is None)
        assert calls == ["homotopy"]  # exactly one of the two runs


def test_duplicates_are_solved_once_and_keep_the_weight_on_one_copy():
    from convalue.solvers.homotopy import representatives
    from convalue.solvers.operators import GradientOperator, GramOperator

    G, g = random_gradients(2, 16, 6, True)  # rows 0 and 1 equal
    G[5] = -G[3]  # a negated copy
    G[7] = G[0]  # a third copy of row 0
    K, beta = G @ G.T, G @ g
    for op in (GramOperator(K, beta, rank=6), GradientOperator(G, g)):
        assert sorted(set(range(16)) - set(representatives(op, max_pairs=DEFAULT_POLICY.homotopy.max_pairs).tolist())) == [1, 5, 7]
    for kw in ({"gamma": 1e-4 * float(np.abs(beta).max())}, {"budget": 1.5}, {"budget": 50.0}):
        sol = solve_kmm(K, beta, **kw)
        ref = solve_kmm(K, beta, **kw, method="cvxpy")
        assert sol.status == "optimal" and np.all(sol.w[[1, 5, 7]] == 0)
        assert sol.objective <= ref.objective + 1e-7 * max(1.0, abs(ref.objective)), kw


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(4, 60), p=st.integers(2, 30), copies=st.integers(0, 6))
def test_duplicate_search_finds_the_groups_a_pairwise_scan_finds(seed, n, p, copies):
    """The projection search (one product, pairs within sqrt(tol) ||v|| checked) groups candidates exactly as the
    O(N^2) definition does: copies, negated copies and copies within the tolerance (1e-8 noise)."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    from convalue.solvers.homotopy import _duplicate_pairs
    from convalue.solvers.operators import GradientOperator, GramOperator

    rng = np.random.default_rng(seed)
    G = rng.normal(size=(n, p))
    for _ in range(copies):
        i, j = rng.integers(0, n, 2)
        G[j] = rng.choice([1.0, -1.0]) * G[i] + (1e-8 * rng.normal(size=p) if rng.random() < 0.3 else 0.0)
    K = G @ G.T

    def groups(i, j):
        return connected_components(coo_matrix((np.ones(len(i)), (i, j)), shape=(n, n)), directed=False)[1]

    for op in (GramOperator(K, K[0]), GradientOperator(G, G[0])):
        tol = 1e-12 * float(op.diag.max())
        dist = op.diag[:, None] + op.diag[None, :] - 2 * np.abs(K)
        np.fill_diagonal(dist, np.inf)
        truth = groups(*np.nonzero(dist <= tol))
        found = groups(*_duplicate_pairs(op, tol, DEFAULT_POLICY.homotopy.max_pairs))
        # the same partition: label maps are one-to-one
        assert len(set(zip(truth, found))) == len(set(truth)) == len(set(found))


def test_an_unconverged_solve_returns_the_closest_iterate_any_strategy_reached(monkeypatch):
    """When every step fails (each one faked here), the fallbacks start from (and return) the iterate with the
    smallest KKT violation: the first ADMM run's, not a later run's zero start."""
    import convalue.solvers.active_set as AS
    import convalue.solvers.admm as admm_module
    import convalue.solvers.penalised as penalised_module
    import convalue.solvers.working_set as WS
    from convalue.solvers.operators import GramOperator
    from convalue.solvers.penalised import solve_penalised

    G, g = random_gradients(8, 60, 20, False)
    K, beta = G @ G.T, G @ g
    gamma = 1e-3 * float(np.abs(beta).max())
    good = solve_kmm(K, beta, gamma=gamma).w * (1 + 1e-4)  # near-optimal, does not certify
    calls = []

    def admm_once(op, gamma, w0, scale, **kw):
        calls.append(kw["rho"])
        return (good.copy() if len(calls) == 1 else np.zeros(op.n)), 10, False, False

    monkeypatch.setattr(admm_module, "admm_polish", admm_once)
    monkeypatch.setattr(AS, "pdas", lambda op, gamma, w, *a, **k: (np.zeros(op.n), 1, False))
    monkeypatch.setattr(AS, "nnls_polish", lambda op, gamma, w, scale, deadline=None: (w, False))
    monkeypatch.setattr(AS, "coordinate_descent", lambda op, gamma, w, **k: (w, 0))
    # penalised.py holds its own name for the reference (imported at its top)
    monkeypatch.setattr(penalised_module, "solve_cvxpy", lambda problem, tolerance: (np.zeros(problem.n), {}))
    monkeypatch.setattr(WS, "working_set_homotopy", lambda op, *a, **k: (np.zeros(op.n), 0, False))
    w, info = solve_penalised(GramOperator(K, beta), gamma)  # rank unknown: the ADMM chain
    # ADMM's first steps, then its rho and the policy's retries in full
    assert len(calls) == 2 + len(DEFAULT_POLICY.admm.rho_retries) and not info["converged"]
    assert info["fallback"] == "coordinate_descent+nnls_polish"  # every fallback ran, in the plan's order
    assert np.array_equal(w, good)
