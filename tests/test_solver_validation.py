"""KMM input validation: bad input, symmetrisation, PSD checks, the rank and certificates."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from solver_helpers import _clustered, _recorded, random_gradients

from convalue.solvers import DEFAULT_POLICY, KMMInputError, make_problem, solve_kmm


def test_low_precision_gram_refusal_names_its_dtype_and_the_remedies():
    """A float32/float16 Gram of N > p gradients can be indefinite by round-off alone: say so, and how to proceed."""
    rng = np.random.default_rng(0)
    G = rng.normal(size=(80, 8))
    K, beta = G @ G.T, G @ rng.normal(size=8)
    K16 = K.astype(np.float16)  # lambda_min about -1e-2 of a PSD rank-8 K: elementwise rounding, any BLAS
    with pytest.raises(KMMInputError, match=r"K came as float16, .*form it in float64 .*or pass a larger psd_tol$"):
        solve_kmm(K16, beta, gamma=0.1)
    assert solve_kmm(K16, beta, gamma=0.1, psd_tol=1e-3).status == "optimal"
    assert solve_kmm(K, beta, gamma=0.1).status == "optimal"
    with pytest.raises(KMMInputError) as indefinite:  # a float64 K gets no dtype hint
        solve_kmm(np.array([[1.0, 2.0], [2.0, 1.0]]), np.ones(2), gamma=0.1)
    assert "came as" not in str(indefinite.value)
    with pytest.raises(KMMInputError, match=r"psd_tol must be a finite number >= 0, got -1\.0"):
        solve_kmm(K, beta, gamma=0.1, psd_tol=-1.0)


@pytest.mark.parametrize(
    ("K", "beta", "kw", "match"),
    [
        (np.eye(3), np.ones(3), {"gamma": -0.1}, "gamma must be"),
        (np.eye(3), np.ones(3), {"budget": 0.0}, "budget must be"),
        (np.eye(3), np.ones(3), {"gamma": np.float64(-1.0)}, r"gamma must be a finite number >= 0, got -1\.0$"),
        (np.eye(3), np.ones(3), {"gamma": "0.1"}, r"gamma must be .*, got '0\.1'"),
        (np.eye(3), np.ones(3), {"gamma": np.array([0.1, 0.2])}, r"gamma must be .*, got array"),
        (np.eye(3), np.ones(3), {"budget": np.array([1.0])}, r"budget must be .*, got array\(\[1\.\]\)"),
        (np.eye(3), np.ones(3), {"gamma": True}, "gamma must be"),
        (np.eye(3), np.ones(3), {"budget": 1j}, "budget must be"),
        (np.eye(3), np.ones(3), {"gamma": 0.1, "costs": np.array([1.0, 0.0, 1.0])}, r"got 0\.0 at index 1$"),
        (np.eye(3), np.ones(3), {}, "exactly one"),
        (np.eye(3), np.ones(3), {"gamma": 0.1, "budget": 1.0}, "exactly one"),
        (np.ones((2, 3)), np.ones(2), {"gamma": 0.1}, "square"),
        (np.eye(3), np.ones(2), {"gamma": 0.1}, "length N=3"),
        (np.array([[1.0, np.nan], [np.nan, 1.0]]), np.ones(2), {"gamma": 0.1}, r"K contains NaN or inf: K\[0, 1\] = nan"),
        (np.array([[1.0, 0.5], [0.0, 1.0]]), np.ones(2), {"gamma": 0.1}, "not symmetric"),
        (np.array([[1.0, 2.0], [2.0, 1.0]]), np.ones(2), {"gamma": 0.1}, "most negative eigenvalue"),
        (np.diag([1.0, 0.0]), np.ones(2), {"gamma": 0.1}, "zero-norm"),
        (np.eye(2), np.array([1.0, np.inf]), {"gamma": 0.1}, r"beta contains NaN or inf: beta\[1\] = inf"),
        (np.eye(3), np.ones(3), {"gamma": 0.1, "tol": 0.0}, r"tol must be a finite number > 0, got 0\.0$"),
        (np.eye(3), np.ones(3), {"gamma": 0.1, "tol": np.nan}, "tol must be a finite number > 0"),
        (np.eye(3), np.ones(3), {"gamma": 0.1, "tol": 1e-2}, r"tol must be at most 0\.001 .*, got 0\.01$"),
        (np.eye(3), np.ones(3), {"budget": 1.0, "tol": 1e-6}, "penalised form .* budget form is always solved exactly"),
        (np.eye(3), np.ones(3), {"gamma": 0.1, "tol": 1e-6, "method": "cvxpy"}, "not to method 'cvxpy'"),
    ],
)
def test_bad_input_is_a_clear_error(K, beta, kw, match):
    with pytest.raises(KMMInputError, match=match):
        solve_kmm(K, beta, **kw)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31), n=st.integers(1, 40), tile=st.integers(1, 9), share=st.floats(0.0, 1.0))
def test_symmetrised_equals_the_whole_matrix_formula_at_any_tile_size(seed, n, tile, share):
    """Tile pairs that are exactly symmetric (copied as they are) and those that are not give 0.5 (A + A^T)."""
    from convalue.solvers.problem import symmetrised

    rng = np.random.default_rng(seed)
    A = rng.normal(size=(n, n))  # asymmetric where both indices are in `odd` (a share of them), symmetric elsewhere
    odd = rng.random(n) < share
    A = np.where(odd[:, None] & odd[None, :], A, np.triu(A) + np.triu(A, 1).T)  # sym_tol = 2 never refuses it
    S, scale = symmetrised(A, 2.0, tile)
    assert np.array_equal(S, 0.5 * (A + A.T)) and scale == float(np.abs(A).max())


def test_symmetrisation_in_tiles_is_exact_and_finds_asymmetry_in_any_tile():
    """make_problem symmetrises K a tile at a time: the result is exactly 0.5 (K + K^T) and exactly symmetric,
    and an asymmetry beyond the tolerance in any tile is refused with its size."""
    policy = DEFAULT_POLICY.but(validation={"symmetrise_tile": 7})  # 30 candidates: 5 x 5 tiles, the last partial
    G, g = random_gradients(6, 30, 40, False)
    K = G @ G.T
    scale = float(np.abs(K).max())
    within = K.copy()
    within[29, 3] += 1e-8 * scale  # inside sym_tol = 1e-6, in a lower tile
    prob = make_problem(within, G @ g, gamma=0.1, policy=policy)
    assert np.array_equal(prob.K, 0.5 * (within + within.T)) and np.array_equal(prob.K, prob.K.T)
    beyond = K.copy()
    beyond[3, 29] += 1e-3 * scale
    with pytest.raises(KMMInputError, match=f"max \\|K - K\\^T\\| = {1e-3 * scale:.3g}"):
        make_problem(beyond, G @ g, gamma=0.1, policy=policy)


def test_large_indefinite_matrix_is_rejected_without_a_dense_eigendecomposition():
    K = np.eye(3001)
    K[17, 18] = K[18, 17] = 2.0  # the block [[1, 2], [2, 1]] has eigenvalue -1; every K_ii is 1
    with pytest.raises(KMMInputError, match=r"most negative eigenvalue at most -1 \(a LOBPCG estimate\)"):
        make_problem(K, np.ones(3001), gamma=0.1)


def test_certificate_matches_the_separate_kkt_and_objective():
    """certify's objective is problem.objective's, and its KKT tells an optimum from a wrong point, with and without prices."""
    from convalue.solvers.kkt import certify

    G, g = _clustered(60, 80, seed=2)
    K, beta = G @ G.T, G @ g
    costs = np.random.default_rng(3).uniform(0.5, 2.0, size=60)
    for kw in ({"gamma": 1e-3}, {"budget": 0.8}, {"budget": 0.8, "costs": costs}, {"gamma": 1e-3, "costs": costs}):
        prob = make_problem(K, beta, **kw)
        for w, optimal in ((solve_kmm(K, beta, **kw).w, True), (np.linspace(-0.1, 0.2, 60), False)):
            kkt, objective = certify(prob, w)
            assert (kkt < 1e-7) if optimal else (kkt > 1e-3)
            assert objective == pytest.approx(prob.objective(w), rel=1e-12, abs=1e-14)


def test_validation_records_the_rank_and_the_operator_bounds_supports_by_it():
    from convalue.solvers.operators import GramOperator

    G, g = random_gradients(3, 50, 12, True)
    prob = make_problem(G @ G.T, G @ g, gamma=0.1)
    assert prob.rank == 12
    assert prob.unit_cost()[0].rank == 12
    assert make_problem(np.eye(4), np.ones(4), gamma=0.1).rank == 4
    assert GramOperator(prob.K, prob.beta, rank=prob.rank).rank_bound == 12
    assert GramOperator(prob.K, prob.beta).rank_bound == 50  # unknown rank: no bound below N


def test_small_k_takes_the_pivoted_cholesky_and_eigvalsh_only_to_name_a_negative_eigenvalue(monkeypatch):
    """Up to the policy's eigvalsh_max_n the Cholesky factors go first: a PSD K (full-rank, N > p, duplicated) gets
    the rank the spectrum gives without an eigvalsh; an indefinite K pays for one, which names its exact lambda_min.
    The calls are decided by margins far above round-off: the zero eigenvalues of these K sit at 1e-13 of their
    largest against the rank threshold of 1e-10, and the indefinite one at -0.01 against a tolerance of 1e-6."""
    import convalue.solvers.problem as problem_module

    calls = []
    real = np.linalg.eigvalsh
    monkeypatch.setattr(problem_module.np.linalg, "eigvalsh", _recorded(real, calls, lambda a: a.shape))
    for seed, n, p, dup in ((3, 50, 12, True), (4, 40, 60, True), (4, 40, 60, False), (5, 200, 80, False)):
        G, g = random_gradients(seed, n, p, dup)
        K = G @ G.T
        eig = real(0.5 * (K + K.T))
        assert make_problem(K, G @ g, gamma=0.1).rank == int(np.count_nonzero(eig > 1e-10 * eig[-1]))
    assert calls == []
    indefinite = K - (eig[0] + 0.01) * np.eye(n)  # lambda_min = -0.01
    with pytest.raises(KMMInputError, match=r"most negative eigenvalue -0\.01 \(tolerance"):
        make_problem(indefinite, G @ g, gamma=0.1)
    assert calls == [(n, n)]


def test_a_full_rank_k_is_certified_by_the_unpivoted_cholesky_and_anything_else_by_the_pivoted_one(monkeypatch):
    """A K that may have full rank (no rank bound below N) tries dpotrf first: a full-rank K needs nothing more; a
    rank-deficient one, a near-duplicate pair whose pivot falls below the rank threshold, or a caller's bound
    below N goes to dpstrf, and every rank equals the spectrum's. No call is borderline: the near-duplicate pair's
    pivot is 1e-14 of max K_ii, 1e4 times below the threshold (1e-10), and the other pivots are of order one."""
    import scipy.linalg as sla

    import convalue.solvers.problem as problem_module

    calls = []
    for name in ("dpotrf", "dpstrf"):
        monkeypatch.setattr(problem_module.sla.lapack, name,
                            _recorded(getattr(sla.lapack, name), calls, lambda *a, name=name, **k: name))

    def spectrum_rank(K):
        eig = np.linalg.eigvalsh(K)
        return int(np.count_nonzero(eig > 1e-10 * eig[-1]))

    G, g = random_gradients(6, 60, 100, False)  # N < p: full rank
    assert make_problem(G @ G.T, G @ g, gamma=0.1).rank == 60 == spectrum_rank(G @ G.T)
    assert calls == ["dpotrf"]
    calls.clear()
    G, g = random_gradients(6, 60, 20, False)  # N > p, no bound: dpotrf fails, dpstrf gives the rank
    assert make_problem(G @ G.T, G @ g, gamma=0.1).rank == 20 == spectrum_rank(G @ G.T)
    assert calls == ["dpotrf", "dpstrf"]
    calls.clear()
    assert make_problem(G @ G.T, G @ g, gamma=0.1, rank_bound=20).rank == 20  # the bound skips dpotrf
    assert calls == ["dpstrf"]
    calls.clear()
    G, g = random_gradients(6, 60, 100, False)
    G[1] = G[0] + 1e-7 * G[2]  # positive definite in float64, but a pivot of about 1e-14 max K_ii
    assert make_problem(G @ G.T, G @ g, gamma=0.1).rank == 59 == spectrum_rank(G @ G.T)
    assert calls == ["dpotrf", "dpstrf"]


def test_pivoted_cholesky_validation_records_the_rank_and_refuses_indefinite_k():
    """Above eigvalsh_max_n validation takes the Cholesky factors alone: the same rank, PSD-ness certified by the
    factor (the pivoted one: its Schur complement's norm), and a clear refusal with LOBPCG's lambda_min when K is
    indefinite."""
    policy = DEFAULT_POLICY.but(validation={"eigvalsh_max_n": 10})  # the 3000 < N <= 8000 branch at a test's size
    G, g = random_gradients(3, 50, 12, True)
    assert make_problem(G @ G.T, G @ g, gamma=0.1, policy=policy).rank == 12
    G, g = random_gradients(4, 40, 60, True)  # N < p, but one exact duplicate
    assert make_problem(G @ G.T, G @ g, gamma=0.1, policy=policy).rank == 39
    G, g = random_gradients(4, 40, 60, False)
    assert make_problem(G @ G.T, G @ g, gamma=0.1, policy=policy).rank == 40
    K = G @ G.T
    lam = np.linalg.eigvalsh(K)[0]
    indefinite = K - (lam + 0.01) * np.eye(40)  # lambda_min = -0.01, far beyond the tolerance
    # the pivoted check fails, and LOBPCG's Ritz value names the eigenvalue (exact at this size)
    with pytest.raises(KMMInputError, match="not positive semidefinite: most negative eigenvalue at most -0.01 "):
        make_problem(indefinite, G @ g, gamma=0.1, policy=policy)


def test_the_estimate_beyond_the_pivoted_check_never_refuses_a_psd_k_and_finds_negative_eigenvalues():
    """Above pivoted_max_n without an affordable rank bound, lambda_min comes from a fixed LOBPCG run: its Ritz
    value is never below lambda_min (a rank-deficient PSD K passes), and it finds an isolated negative
    eigenvalue and a cluster of them (a Gram matrix plus symmetric noise, as from low-precision gradients)."""
    from convalue.solvers.problem import ritz_floor

    # the N > 8000 branch at a test's size
    policy = DEFAULT_POLICY.but(validation={"eigvalsh_max_n": 10, "pivoted_max_n": 10})
    G, g = _clustered(400, 100, seed=3)  # rank 100: 300 zero eigenvalues, the regime where ARPACK stalled
    K, beta = G @ G.T, G @ g
    assert ritz_floor(K, policy.validation) >= np.linalg.eigvalsh(K)[0] - 1e-10
    assert make_problem(K, beta, gamma=1e-3, policy=policy).rank is None
    rng = np.random.default_rng(5)
    v = rng.normal(size=400)
    v /= np.linalg.norm(v)
    E = rng.normal(size=(400, 400)) * 2e-3
    for bad in (K - 2.0 * np.outer(v, v), K + 0.5 * (E + E.T)):
        lam = np.linalg.eigvalsh(bad)[0]
        ritz = ritz_floor(bad, policy.validation)
        assert lam <= ritz + 1e-10 and ritz < 0.5 * lam < -1e-3  # an upper bound, and within half of lambda_min
        with pytest.raises(KMMInputError, match=f"most negative eigenvalue at most {ritz:.3g} \\(a LOBPCG estimate\\)"):
            make_problem(bad, beta, gamma=1e-3, policy=policy)


def test_a_callers_rank_bound_stands_in_where_validation_does_not_compute_the_rank():
    """Above pivoted_max_n the rank is unknown unless the caller bounds it (p for K = G G^T); with the bound an
    N > p problem plans the homotopy and is exact. A bound caps a computed rank, and a bad one is refused."""
    G, g = _clustered(60, 15, seed=2)
    K, beta = G @ G.T, G @ g
    assert make_problem(K, beta, gamma=1e-3, rank_bound=100).rank == 15  # the computed rank stands
    # the N > 8000 branch at a test's size
    large = DEFAULT_POLICY.but(validation={"eigvalsh_max_n": 10, "pivoted_max_n": 10})
    assert make_problem(K, beta, gamma=1e-3, policy=large).rank is None
    # the bound makes the pivoted check affordable
    assert make_problem(K, beta, gamma=1e-3, rank_bound=30, policy=large).rank == 15
    unaffordable = large.but(validation={"pivoted_max_work": 0.0})  # ... and where it does not, the bound stands in
    assert make_problem(K, beta, gamma=1e-3, rank_bound=15, policy=unaffordable).rank == 15
    assert make_problem(K, beta, gamma=1e-3, rank_bound=600, policy=unaffordable).rank == 60
    sol = solve_kmm(K, beta, gamma=1e-3, rank_bound=15, policy=unaffordable)
    ref = solve_kmm(K, beta, gamma=1e-3, method="cvxpy")
    assert sol.status == "optimal" and sol.info["plan"][0] == "homotopy" and sol.kkt <= 1e-9
    assert sol.objective <= ref.objective + 1e-9 * max(1.0, abs(ref.objective))
    for bad in (0, -3, 2.5, True, "15"):
        with pytest.raises(KMMInputError, match="rank_bound must be a positive integer"):
            make_problem(K, beta, gamma=1e-3, rank_bound=bad)
