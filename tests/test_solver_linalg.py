"""KMM operators and linear algebra: float32 factors refined to float64, Anderson."""

from __future__ import annotations

import numpy as np
import pytest
from solver_helpers import _near_parallel

from convalue.solvers import DEFAULT_POLICY, solve_kmm


def test_mixed_precision_support_solve_refines_to_float64_or_declines():
    from convalue.solvers.linalg import mixed_precision_solve

    rng = np.random.default_rng(5)
    X = rng.normal(size=(300, 600))
    K = X @ X.T / 600  # well conditioned
    b = rng.normal(size=300)
    x = mixed_precision_solve(K.astype(np.float32), b, lambda v: K @ v)
    assert x is not None and np.linalg.norm(K @ x - b) <= 1e-12 * np.linalg.norm(b)
    K[:, 1], K[1, :] = K[:, 0], K[0, :]
    K[1, 1] = K[0, 0] * (1 + 1e-9)  # a duplicated candidate: singular in float32
    assert mixed_precision_solve(K.astype(np.float32), b, lambda v: K @ v) is None  # the caller then uses the float64 factor / least squares


def test_large_dense_supports_take_the_float32_path_and_stay_exact():
    """Supports above the policy's mixed_min_n factor in float32; the answer must still match the reference."""
    rng = np.random.default_rng(9)
    centers = rng.normal(size=(30, 1500))
    G = centers[rng.integers(0, 30, size=400)] + 0.5 * rng.normal(size=(400, 1500))
    G /= np.linalg.norm(G, axis=1, keepdims=True)
    g = centers[:4].sum(axis=0) / np.linalg.norm(centers[:4].sum(axis=0))
    K, beta = G @ G.T, G @ g
    a = solve_kmm(K, beta, gamma=1e-4)
    assert np.count_nonzero(a.w) > DEFAULT_POLICY.linalg.mixed_min_n and a.kkt < 1e-10
    b = solve_kmm(K, beta, gamma=1e-4, method="cvxpy")
    assert a.objective <= b.objective + 1e-9 * max(1.0, abs(b.objective))


@pytest.mark.parametrize("keep_copy", [True, False])
def test_gram_operator_support_solve_float32_gather_matches_float64(keep_copy):
    """GramOperator's float32 factorisations give float64 answers (1-D and 2-D), with or without a kept float32 K."""
    from convalue.solvers import operators

    linalg = DEFAULT_POLICY.linalg if keep_copy else DEFAULT_POLICY.but(linalg={"float32_copy_max_n": 100}).linalg
    rng = np.random.default_rng(11)
    X = rng.normal(size=(400, 900))
    op = operators.GramOperator(X @ X.T / 900, rng.normal(size=400), linalg=linalg)
    A = np.sort(rng.choice(400, size=linalg.mixed_min_n + 40, replace=False))
    Kaa = op.K[np.ix_(A, A)]
    rhs = rng.normal(size=(A.size, 2))
    x = op.solve_support(A, rhs)
    assert x.shape == rhs.shape and np.linalg.norm(Kaa @ x - rhs) <= 1e-12 * np.linalg.norm(rhs)
    assert np.allclose(op.solve_support(A, rhs[:, 0]), x[:, 0], rtol=0, atol=1e-12 * np.abs(x).max())
    b = rng.normal(size=400)
    y = op.shifted_solver(0.5)(b)
    assert np.linalg.norm((op.K + 0.5 * np.eye(400)) @ y - b) <= 1e-4 * np.linalg.norm(b)  # a float32 factor
    assert (op.float32_copy() is not None) == keep_copy
    if keep_copy:  # shifted_solver factors its own copy: the kept float32 K is left as it was
        assert np.array_equal(op.float32_copy(), op.K.astype(np.float32))


def test_gradient_operator_float32_paths_give_float64_answers(monkeypatch):
    """GradientOperator's large supports factor G_A G_A^T formed in float32 and refine to float64 accuracy (1-D and
    2-D right-hand sides); a support float32 cannot resolve (a near-duplicate pair) takes the float64 matrix; the
    shifted solver approximates (G G^T + rho I)^-1 at least to ADMM's needs."""
    from convalue.solvers import operators

    rng = np.random.default_rng(17)
    X = rng.normal(size=(400, 900)) / np.sqrt(900)
    op = operators.GradientOperator(X, rng.normal(size=900))
    A = np.sort(rng.choice(400, size=DEFAULT_POLICY.linalg.mixed_min_n + 40, replace=False))
    Kaa = X[A] @ X[A].T
    rhs = rng.normal(size=(A.size, 2))
    x = op.solve_support(A, rhs)
    assert x.shape == rhs.shape and np.linalg.norm(Kaa @ x - rhs) <= 1e-12 * np.linalg.norm(rhs)
    assert np.allclose(op.solve_support(A, rhs[:, 0]), x[:, 0], rtol=0, atol=1e-12 * np.abs(x).max())
    K32 = op.support_gram32(A)  # the support's rows cast, never a float32 copy of all of G
    assert K32.dtype == np.float32 and np.allclose(K32, Kaa, rtol=0, atol=1e-5)
    b = rng.normal(size=400)
    y = op.shifted_solver(0.5)(b)
    assert np.linalg.norm((X @ X.T + 0.5 * np.eye(400)) @ y - b) <= 1e-4 * np.linalg.norm(b)

    calls = []
    real = operators.solve_dense
    monkeypatch.setattr(operators, "solve_dense", lambda K, b, **kw: calls.append(kw) or real(K, b, **kw))
    Y = X.copy()
    # a pair 1e-9 apart, 60 times below float32's resolution (6e-8): singular in float32 under any rounding, so the
    # float64 matrix and its least squares take over (one float64 call that does not try float32 again)
    Y[A[1]] = Y[A[0]] * (1 + 1e-9)
    dup = operators.GradientOperator(Y, rng.normal(size=900))
    r = rng.normal(size=A.size)
    r[1] = r[0] * (1 + 1e-9)  # a consistent right-hand side for the near-duplicate pair
    z = dup.solve_support(A, r)
    assert calls == [{"mixed_min_n": None}]
    assert np.linalg.norm(Y[A] @ (Y[A].T @ z) - r) <= 1e-8 * np.linalg.norm(r)


def test_gradient_operator_sub_keeps_the_larger_sets():
    """sub() is exact and a new array each call; a set under half the kept one's size, or above the policy's
    sub_keep_max_n, leaves the kept matrix as it was, and a set sharing half of it reuses it (a mark on the kept
    matrix shows)."""
    from convalue.solvers import operators

    rng = np.random.default_rng(29)
    X = rng.normal(size=(500, 300))
    op = operators.GradientOperator(X, rng.normal(size=300),
                                    linalg=DEFAULT_POLICY.but(linalg={"sub_keep_max_n": 350}).linalg)
    E = np.sort(rng.choice(500, size=300, replace=False))
    first = op.sub(E)
    assert np.allclose(first, X[E] @ X[E].T, rtol=0, atol=1e-12)
    first[:] = 0.0  # the caller's array: the kept one is a copy
    kept = op._last64
    small = E[:40]
    assert np.allclose(op.sub(small), X[small] @ X[small].T, rtol=0, atol=1e-12) and op._last64 is kept
    big = np.arange(400)
    op.sub(big)
    assert op._last64 is kept  # above sub_keep_max_n: not kept
    kept[1][:] += 1.0  # a mark: the next set, E plus a few, copies its shared block
    more = np.concatenate([E, np.setdiff1d(np.arange(500), E)[:10]])
    M = op.sub(more)
    assert np.allclose(M[:300, :300], X[E] @ X[E].T + 1.0, rtol=0, atol=1e-12)
    assert np.allclose(M[300:], X[more[300:]] @ X[more].T, rtol=0, atol=1e-12)


@pytest.mark.parametrize("rho", [1e-3, 1e-2])
def test_gradient_shifted_solver_takes_float64_where_float32_loses_the_answer(rho):
    """Near-parallel gradients (G^T G's top eigenvalue about N against rho): the shifted solver's float64 factor
    answers to 1e-8, which a float32 factor of rho I + G^T G could not reach."""
    from convalue.solvers.operators import GradientOperator

    rng = np.random.default_rng(23)
    G, g = _near_parallel(rng, 600, 800, 3)
    op = GradientOperator(G, g)
    b = rng.normal(size=600)
    x = op.shifted_solver(rho)(b)
    assert np.linalg.norm(G @ (G.T @ x) + rho * x - b) <= 1e-8 * np.linalg.norm(b)


def test_gradient_operator_reuses_the_last_support_matrix():
    """support_gram32 copies the block a support shares with the last one (at least half of it) and computes only
    the new candidates' rows, in the support's own order; the array it returns is the caller's to overwrite (the
    float32 factor works in place); a support sharing less is computed afresh."""
    from convalue.solvers.operators import GradientOperator

    rng = np.random.default_rng(19)
    X = rng.normal(size=(500, 700)) / np.sqrt(700)
    g = rng.normal(size=700)
    op = GradientOperator(X, g)
    A = np.sort(rng.choice(500, size=300, replace=False))
    first = op.support_gram32(A)
    first[:] = 0.0  # as spotrf overwrites it: the kept copy must not change
    op._last32[1][:] += np.float32(1.0)  # a mark on the kept matrix: the reused block carries it
    out = np.setdiff1d(np.arange(500), A)
    B = rng.permutation(np.concatenate([A[10:], rng.choice(out, size=12, replace=False)]))
    K = op.support_gram32(B)
    shared = np.isin(B, A)
    exact = (X[B] @ X[B].T).astype(np.float32)
    assert np.array_equal(K, K.T)
    assert np.allclose(K[np.ix_(shared, shared)], exact[np.ix_(shared, shared)] + 1.0, rtol=0, atol=1e-5)
    assert np.allclose(K[~shared], exact[~shared], rtol=0, atol=1e-5)  # the new rows (and columns): products
    C = np.sort(rng.choice(out, size=150, replace=False))  # shares nothing with B: computed afresh, no mark
    assert np.allclose(op.support_gram32(C), (X[C] @ X[C].T).astype(np.float32), rtol=0, atol=1e-5)


@pytest.mark.parametrize("n_support", [40, 300])  # the float64 factor, and the refined float32 one
def test_support_solve_residual_is_the_residual_of_its_solution(n_support):
    """solve_support_residual's r is K w - beta at the padded solution, for both operators; on the refined
    path it is the refinement's last product (no extra product), bit for bit what residual() computes."""
    from convalue.solvers import operators
    from convalue.solvers.active_set import residual

    rng = np.random.default_rng(13)
    X = rng.normal(size=(1000, 1200)) / np.sqrt(1200)
    g = rng.normal(size=1200)
    A = np.sort(rng.choice(1000, size=n_support, replace=False))
    rhs = rng.normal(size=n_support)
    for op in (operators.GramOperator(X @ X.T, X @ g), operators.GradientOperator(X, g)):
        x, r = op.solve_support_residual(A, rhs)
        w = np.zeros(op.n)
        w[A] = x
        assert np.array_equal(x, op.solve_support(A, rhs))
        assert np.allclose(r, residual(op, w), rtol=0, atol=1e-12)
        assert np.abs(r[A] + op.beta[A] - rhs).max() <= 1e-10 * np.abs(rhs).max()  # K_AA x = rhs
        if isinstance(op, operators.GramOperator) and n_support >= 256:
            assert np.array_equal(r, residual(op, w))  # the same product K @ w


def test_anderson_acceleration_finds_a_linear_maps_fixed_point_in_fewer_steps():
    """On an affine contraction (ADMM once its signs hold) Anderson's steps reach the fixed point far sooner."""
    from convalue.solvers.anderson import Anderson

    rng = np.random.default_rng(0)
    Q, _ = np.linalg.qr(rng.normal(size=(60, 60)))
    A = Q @ np.diag(np.linspace(-0.95, 0.95, 60)) @ Q.T
    b = rng.normal(size=60)
    fixed = np.linalg.solve(np.eye(60) - A, b)

    def steps(accelerated: bool) -> int:
        acc, v = Anderson(60, memory=8), np.zeros(60)
        for k in range(1, 2000):
            tv = A @ v + b
            if np.linalg.norm(tv - fixed) <= 1e-10 * np.linalg.norm(fixed):
                return k
            v = acc.push(v, tv) if accelerated else tv
        return 2000

    plain, fast = steps(False), steps(True)
    assert fast * 4 <= plain < 2000
    with pytest.raises(ValueError, match="memory must be >= 1"):
        Anderson(3, memory=0)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_self_gram_is_the_product_exactly_symmetric_in_panels(dtype):
    """self_gram is numpy's X @ X.T bit for bit up to a panel, and past it the same product to round-off, exactly
    symmetric (the solvers rely on it), from panel products that never take numpy's syrk shortcut."""
    from convalue.solvers.linalg import self_gram

    X = np.random.default_rng(4).normal(size=(23, 9)).astype(dtype)
    assert np.array_equal(self_gram(X, panel=23), X @ X.T)
    K = self_gram(X, panel=5)
    assert K.dtype == dtype and np.array_equal(K, K.T)
    np.testing.assert_allclose(K, X.astype(np.float64) @ X.T.astype(np.float64),
                               rtol=0, atol=(1e-12 if dtype == np.float64 else 1e-5) * np.abs(X).max() ** 2 * 9)


def test_self_gram_runs_where_numpy_syrk_segfaults():
    """16,000 x 1024 float64: numpy's X @ X.T segfaults there with two OpenBLAS threads on the development machine
    (numpy#19685); self_gram's panels give the product."""
    from convalue.solvers.linalg import self_gram

    rng = np.random.default_rng(5)
    X = rng.normal(size=(16_000, 1024)) / 32.0
    K = self_gram(X)
    rows = rng.choice(16_000, size=8, replace=False)
    np.testing.assert_allclose(K[rows], X[rows] @ X.T.copy(), rtol=0, atol=1e-12)
    assert np.array_equal(K[rows][:, rows], K[rows][:, rows].T)
