"""KMM ADMM and tolerances: rho scaling, certified early stops, and where the exact polish stays."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kmm_oracle import scipy_penalised
from solver_helpers import (
    _assert_far_from_a_support_change,
    _clustered,
    _near_parallel,
    random_gradients,
)

from convalue.solvers import DEFAULT_POLICY, kkt_violation, make_problem, solve_kmm


def test_dense_solve_is_scale_free_and_its_admm_rho_follows_gamma():
    """The same plan and answer when K, beta and gamma scale together (every threshold is relative to max|beta| or
    mean K_ii); ADMM's first rho follows gamma / max|beta| in proportion, within its clip."""
    from convalue.solvers.admm import admm_rho

    G, g = _clustered(300, 600, seed=4)
    K, beta = G @ G.T, G @ g
    a = solve_kmm(K, beta, gamma=5e-4)
    b = solve_kmm(1e3 * K, 1e3 * beta, gamma=5e-1)
    assert a.info["plan"] == b.info["plan"] and a.info["plan"][0] == "admm_first"
    assert a.kkt <= 1e-10 * max(1.0, float(np.abs(beta).max())) and b.kkt <= 1e-10 * 1e3 * float(np.abs(beta).max())
    assert np.abs(b.w - a.w).max() <= _certificate_gap(K, a.w, a.kkt, b.kkt / 1e3)  # b's violations are 1e3 times a's
    assert b.objective == pytest.approx(1e3 * a.objective, rel=1e-9)
    gmax, rules = float(np.abs(beta).max()), DEFAULT_POLICY.admm
    assert admm_rho(5e-4, gmax, rules) == pytest.approx(admm_rho(5e-1, 1e3 * gmax, rules), rel=1e-12)
    assert admm_rho(1e-3 * gmax, gmax, rules) == pytest.approx(2 * admm_rho(5e-4 * gmax, gmax, rules), rel=1e-12)
    assert admm_rho(1e-9 * gmax, gmax, rules) == rules.rho_min and admm_rho(gmax, gmax, rules) == rules.rho_max


def test_a_tolerance_lets_dense_admm_stop_early_and_certifies_the_stop():
    """A tolerance lets ADMM return its own iterate, Anderson-accelerated once its signs hold, where the support (370
    of 400) is dear to factor; the answer is certified at the tolerance and lies within what its certificate allows
    of the exact one. tol = 1e-4 makes the stop certain on any BLAS: ADMM's float32 iterate reaches KKT 1e-4 well
    before its floor (about 2e-7 here), and K's smallest pivot bound (0.07 of mean K_ii) is 7 times the guard's 0.01.
    """
    from convalue.solvers.admm import early_stop_allowed, stop_level

    G, g = _clustered(400, 800, seed=5)
    K, beta = G @ G.T, G @ g
    scale = max(1.0, float(np.abs(beta).max()))
    exact = solve_kmm(K, beta, gamma=2e-4)
    early = solve_kmm(K, beta, gamma=2e-4, tol=1e-4)
    assert early.status == "optimal" and early.info["early_stop"] and early.info["step"] == "admm_first"
    assert early.summary()["early_stop"] and early.summary()["tol"] == 1e-4 and "early_stop" not in exact.info
    assert 1e-12 * scale < early.kkt <= 1e-4 * scale  # stopped at the tolerance, not polished to round-off
    assert early.kkt == pytest.approx(kkt_violation(make_problem(K, beta, gamma=2e-4), early.w), rel=1e-9)
    assert np.linalg.norm(early.w - exact.w) <= _certificate_gap(K, exact.w, early.kkt, exact.kkt)
    assert exact.objective <= early.objective <= exact.objective + 1e-8 * max(1.0, abs(exact.objective))
    ref = solve_kmm(K, beta, gamma=2e-4, method="cvxpy")
    assert early.objective <= ref.objective + 1e-8 * max(1.0, abs(ref.objective))
    # plain ADMM steps past the settling (no Anderson) stop at a certified iterate too
    plain = solve_kmm(K, beta, gamma=2e-4, tol=1e-4, policy=DEFAULT_POLICY.but(early_stop={"anderson_memory": 0}))
    assert plain.info["early_stop"] and plain.kkt <= 1e-4 * scale
    assert np.linalg.norm(plain.w - exact.w) <= _certificate_gap(K, exact.w, plain.kkt, exact.kkt)
    # the rules that decide it, on their own
    rules = DEFAULT_POLICY.early_stop
    assert stop_level(1e-6, 4.0, rules) == 4e-6 and stop_level(1e-6, 0.5, rules) == 1e-6
    assert stop_level(0.5 * rules.min_tol, 4.0, rules) is None and stop_level(None, 4.0, rules) is None
    assert early_stop_allowed(400, True, 0.07, 1.0, rules)
    assert not early_stop_allowed(399, True, 0.07, 1.0, rules)  # below min_n
    assert not early_stop_allowed(400, False, 0.07, 1.0, rules)  # the gradient form
    assert not early_stop_allowed(400, True, rules.min_lambda, 1.0, rules)  # K nearly singular


def test_a_tolerance_does_not_stop_early_on_a_nearly_singular_k():
    """Near-parallel gradients: lambda_min(K) is 3.6e-5 of mean K_ii and the shifted factor's pivots bound it at
    6e-4, 17 times below the guard's early_stop.min_lambda (0.01), so a tolerance leaves the answer exact: a KKT
    violation of 1e-6 does not pin the scores on such a K. Without the guard (min_lambda 0) ADMM's iterate answers at
    tol = 1e-4 (far above float32's floor, so on any BLAS), certified at the tolerance but far from the optimum."""
    from convalue.solvers.admm import admm_rho
    from convalue.solvers.operators import GramOperator

    G, g = _near_parallel(np.random.default_rng(3), 600, 1200, mix=400)
    K, beta = G @ G.T, G @ g
    gmax = float(np.abs(beta).max())
    gamma = 1e-3 * gmax
    op = GramOperator(K, beta)
    rho = admm_rho(gamma, gmax, DEFAULT_POLICY.admm) * float(np.mean(op.diag))
    bound = op.shifted_solver(rho).lambda_min_bound
    assert 0 < bound < 0.1 * DEFAULT_POLICY.early_stop.min_lambda * float(np.mean(op.diag))  # the guard's margin
    exact = solve_kmm(K, beta, gamma=gamma)
    guarded = solve_kmm(K, beta, gamma=gamma, tol=1e-6)
    assert "early_stop" not in guarded.info and guarded.kkt <= 1e-12 * max(1.0, gmax)
    assert np.linalg.norm(guarded.w - exact.w) <= _certificate_gap(K, exact.w, guarded.kkt, exact.kkt)
    unguarded = solve_kmm(K, beta, gamma=gamma, tol=1e-4, policy=DEFAULT_POLICY.but(early_stop={"min_lambda": 0.0}))
    assert unguarded.info["early_stop"] and unguarded.kkt <= 1e-4 * max(1.0, gmax)
    assert np.abs(unguarded.w - exact.w).max() > 1e-5  # 1.7e-3 measured; the exact answers agree to 1e-11


def test_a_tolerance_keeps_the_polish_where_it_is_cheaper_or_float32_cannot_reach_it():
    """The polish with tol set: a support cheap to factor (early_stop.cube_ratio), a tolerance below float32's floor
    (early_stop.min_tol: the same arithmetic as no tol), and a stalled early stop (that floor lifted), which gives up
    and polishes exactly."""
    from convalue.solvers.admm import support_dear

    G, g = _clustered(400, 800, seed=5)
    K, beta = G @ G.T, G @ g
    scale = max(1.0, float(np.abs(beta).max()))
    rules = DEFAULT_POLICY.early_stop
    # dense by its ratio, 185 of 400 active, where support_dear needs 289: the optimum is far from a change of support
    # (the check below), so round-off, which moves ADMM's float32 iterate by about 1e-7, cannot add the 104 nonzeros
    # it would take: the polish, as without tol
    sparse, sparse_exact = solve_kmm(K, beta, gamma=2e-3, tol=1e-6), solve_kmm(K, beta, gamma=2e-3)
    _assert_far_from_a_support_change(K, beta, 2e-3, sparse_exact.w)
    assert np.count_nonzero(sparse_exact.w) == 185 and not support_dear(288, 400, rules) and support_dear(289, 400, rules)
    assert "early_stop" not in sparse.info and sparse.kkt <= 1e-12 * scale
    assert np.linalg.norm(sparse.w - sparse_exact.w) <= _certificate_gap(K, sparse_exact.w, sparse.kkt,
                                                                         sparse_exact.kkt)
    # below min_tol the tolerance is dropped before ADMM runs: the very same arithmetic, bit for bit
    exact = solve_kmm(K, beta, gamma=2e-4)
    below = solve_kmm(K, beta, gamma=2e-4, tol=0.5 * rules.min_tol)
    assert below.iterations == exact.iterations and np.array_equal(below.w, exact.w) and "early_stop" not in below.info
    # with the floor lifted, a tolerance of 1e-10 is 1000 times below what ADMM's float32 iterate reaches: it stalls
    # and polishes, exactly
    stalled = solve_kmm(K, beta, gamma=2e-4, tol=1e-10, policy=DEFAULT_POLICY.but(early_stop={"min_tol": 0.0}))
    assert stalled.kkt <= 1e-12 * scale and "early_stop" not in stalled.info
    assert np.linalg.norm(stalled.w - exact.w) <= _certificate_gap(K, exact.w, stalled.kkt, exact.kkt)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31), n=st.integers(6, 24), extra=st.integers(0, 20), log_ratio=st.floats(-4, -2.2))
def test_early_stops_are_certified_and_match_the_independent_formulation(seed, n, extra, log_ratio):
    """Full-rank K at gammas dense by their ratio (ADMM's side of the plan), every support counted dear to factor
    and K's conditioning not asked (at these sizes the default policy never stops early): tol = 1e-6 answers are
    certified at it and their objectives match L-BFGS-B's on the split form."""
    G, g = random_gradients(seed, n, n + extra, False)
    K, beta = G @ G.T, G @ g
    gamma = 10**log_ratio * float(np.abs(beta).max())
    eager = DEFAULT_POLICY.but(early_stop={"cube_ratio": 0.0, "min_n": 0, "min_lambda": 0.0})
    sol = solve_kmm(K, beta, gamma=gamma, tol=1e-6, policy=eager)
    scale = max(1.0, float(np.abs(beta).max()))
    assert sol.status == "optimal" and sol.kkt <= 1e-6 * scale
    prob = make_problem(K, beta, gamma=gamma)
    ref = prob.objective(scipy_penalised(K, beta, gamma))
    assert sol.objective <= ref + 1e-6 * max(1.0, abs(ref))


def _certificate_gap(K: np.ndarray, w: np.ndarray, kkt_a: float, kkt_b: float) -> float:
    """The most two answers with KKT violations kkt_a and kkt_b can differ by in the 2-norm on a positive definite K:
    the objective is lambda_min(K)-strongly convex, so each lies within sqrt(N) kkt / lambda_min of the optimum."""
    lam = float(np.linalg.eigvalsh(K)[0])
    assert lam > 0, "the bound needs a positive definite K"
    return np.sqrt(len(w)) * (kkt_a + kkt_b) / lam
