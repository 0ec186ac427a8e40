"""The reduced-Gram working set (convalue.solvers.reduced): its operator, and certified answers at test sizes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from solver_helpers import _clustered

from convalue.solvers import DEFAULT_POLICY, solve_kmm, solve_kmm_gradients
from convalue.solvers.reduced import ReducedGram, reduced_working_set

#: the reduced-Gram working set at a test's size: from any N, small first sets and rounds, and the full homotopy and
#: the probe off, so that a dense gamma's plan reaches it (the plan is facts alone: tests/test_solver_plan.py)
SMALL = DEFAULT_POLICY.but(reduced={"min_n": 1, "start": 64, "min_growth": 32, "polish_violators": 16},
                           homotopy={"max_work": 0}, plan={"homotopy_fallback_work": 0, "probe_max": 0})


def test_the_buffer_holds_k_above_and_the_extended_factor_below_as_a_fresh_factor_would():
    """grow() appends K's rows (float32) and, where a factor exists, the factor's rows: the factor after four
    growths factors K_WW + rho I as one factorisation of it would, each row factored once. The last two append one
    candidate each, whose row of K is C- and F-ordered at once (the factor's row once overwrote it)."""
    rng = np.random.default_rng(0)
    G = rng.normal(size=(300, 80)) / 9.0
    diag = np.einsum("ij,ij->i", G, G)
    op = ReducedGram(G, G @ rng.normal(size=80), diag, linalg=DEFAULT_POLICY.linalg, max_size=200)
    op.grow(np.arange(40, 90))
    solve = op.shifted_solver(0.3)
    for new in (np.arange(0, 30), np.arange(150, 220), np.array([299]), np.array([295])):
        op.grow(new)
    W = np.concatenate([np.arange(40, 90), np.arange(0, 30), np.arange(150, 220), [299, 295]])
    assert np.array_equal(op.W, W) and op.n == W.size and op.factored_rows == W.size
    K = G[W] @ G[W].T
    upper = np.triu_indices(W.size, 1)
    np.testing.assert_allclose(op.buf[upper], K[upper], rtol=0, atol=1e-6 * np.abs(K).max())
    L = np.tril(op.buf)
    np.testing.assert_allclose(L @ L.T, K + 0.3 * np.eye(W.size), rtol=0, atol=1e-5 * np.abs(K).max())
    solve = op.shifted_solver(0.3)  # the same rho: the extended factor, nothing refactored
    assert op.factored_rows == W.size
    b = rng.normal(size=W.size)
    np.testing.assert_allclose(solve(b), np.linalg.solve(K + 0.3 * np.eye(W.size), b), rtol=1e-4, atol=1e-4)
    op.shifted_solver(0.6)  # another rho: one factorisation anew
    assert op.factored_rows == 2 * W.size
    with pytest.raises(ValueError, match="exceed its 200 candidates"):
        op.grow(np.arange(220, 290))
    kept = np.arange(0, W.size, 3)  # pruning compacts K in place and drops the factor
    op.keep(kept)
    Kk = K[np.ix_(kept, kept)]
    upper = np.triu_indices(kept.size, 1)
    assert np.array_equal(op.W, W[kept]) and op.rho is None
    np.testing.assert_allclose(op.buf[upper], Kk[upper], rtol=0, atol=1e-6 * np.abs(K).max())
    solve = op.shifted_solver(0.3)
    b = rng.normal(size=kept.size)
    np.testing.assert_allclose(solve(b), np.linalg.solve(Kk + 0.3 * np.eye(kept.size), b), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(op.buf[upper], Kk[upper], rtol=0, atol=1e-6 * np.abs(K).max())  # K kept above


@pytest.mark.parametrize("gather_max_bytes", [1 << 28, 0])  # the support's rows copied once, or read in blocks
def test_support_solves_are_refined_to_float64_accuracy(gather_max_bytes):
    G, g = _clustered(300, 120, seed=1)
    op = ReducedGram(G, G @ g, np.einsum("ij,ij->i", G, G), linalg=DEFAULT_POLICY.linalg,
                     gather_max_bytes=gather_max_bytes)
    op.grow(np.arange(0, 300, 2))
    A = np.arange(0, 150, 3)
    rhs = np.random.default_rng(2).normal(size=A.size)
    x, r = op.solve_support_residual(A, rhs)
    rows = op.W[A]
    Kaa = G[rows] @ G[rows].T
    assert np.linalg.norm(Kaa @ x - rhs) <= 1e-12 * np.linalg.norm(rhs)
    w = np.zeros(op.n)
    w[A] = x
    np.testing.assert_allclose(r, G[op.W] @ (G[op.W].T @ w) - op.beta, rtol=0, atol=1e-12)
    np.testing.assert_allclose(op.sub(A), Kaa, rtol=0, atol=1e-13)


@settings(max_examples=5, deadline=None)
@given(seed=st.integers(0, 2**16), ratio=st.sampled_from([5e-3, 2e-3, 1e-3]))
def test_the_reduced_working_set_certifies_the_cvxpy_optimum(seed, ratio):
    """On clustered gradients (N > p, supports well below p) it certifies at round-off on all N candidates, at an
    objective no worse than CVXPY's tight reference, without forming K."""
    G, g = _clustered(600, 250, seed=seed % 997)
    beta = G @ g
    gamma = ratio * float(np.abs(beta).max())
    scale = 1e-10 * max(1.0, float(np.abs(beta).max()))
    record: dict = {}
    w, _, ok = reduced_working_set(G, beta, np.einsum("ij,ij->i", G, G), gamma, scale, policy=SMALL, record=record)
    ref = solve_kmm(G @ G.T, beta, gamma=gamma, method="cvxpy")
    r = G @ (G.T @ w) - beta
    on = w != 0
    kkt = max(np.abs(r[on] + gamma * np.sign(w[on])).max(initial=0.0), (np.abs(r[~on]) - gamma).max(initial=0.0))
    assert ok and kkt <= scale and record["rounds"][-1]["exact"] and record["rounds"][-1]["violators"] == 0
    objective = 0.5 * float(w @ (r - beta)) + gamma * float(np.abs(w).sum())
    assert objective <= ref.objective + 1e-9 * max(1.0, abs(ref.objective))
    assert max(x["size"] for x in record["rounds"]) < G.shape[0]  # a working set, not all N


def test_the_gradient_form_plans_it_and_answers_exactly_through_the_public_api():
    """solve_kmm_gradients at a dense gamma with N > p: the plan puts the reduced-Gram working set before ADMM's
    first steps, and the certified answer is the Gram form's (whichever step answered)."""
    G, g = _clustered(900, 300, seed=5)
    gamma = 1e-3 * float(np.abs(G @ g).max())
    sol = solve_kmm_gradients(G, g, gamma=gamma, policy=SMALL)
    plan = sol.info["plan"]
    assert plan.index("reduced_working_set") < plan.index("admm_first")
    scale = max(1.0, float(np.abs(G @ g).max()))
    ref = solve_kmm(G @ G.T, G @ g, gamma=gamma, rank_bound=300, formed=True)
    assert sol.status == ref.status == "optimal" and max(sol.kkt, ref.kkt) <= 1e-10 * scale
    assert sol.objective == pytest.approx(ref.objective, rel=1e-10, abs=1e-12)
