"""KMM solvers: the paper's worked example, an independent formulation, certificates and bad input."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kmm_oracle import scipy_budget, scipy_penalised, sklearn_penalised

from convalue.engine.selection.select import select_top_k
from convalue.solvers import DEFAULT_POLICY, KMMInputError, kkt_violation, make_problem, solve_kmm

G_EX = np.array([[1.0, 0.1], [1.0, 0.1], [0.0, 1.0]])
G_TAR = np.array([1.0, 1.0])


def example():
    return G_EX @ G_EX.T, G_EX @ G_TAR


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


def random_gradients(draw_seed: int, n: int, p: int, dup: bool):
    rng = np.random.default_rng(draw_seed)
    G = rng.normal(size=(n, p))
    if dup and n >= 2:
        G[1] = G[0]  # an exactly duplicated candidate
    return G, rng.normal(size=p)


def random_problem(draw_seed: int, n: int, p: int, dup: bool):
    G, g = random_gradients(draw_seed, n, p, dup)
    return G @ G.T, G @ g


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


def test_kkt_detects_a_wrong_solution():
    K, beta = example()
    prob = make_problem(K, beta, gamma=1e-3)
    sol = solve_kmm(K, beta, gamma=1e-3)
    assert kkt_violation(prob, sol.w) < 1e-7
    assert kkt_violation(prob, sol.w + np.array([0.1, 0, 0])) > 1e-2


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


# --- fast solver vs the CVXPY+OSQP reference; cost-weighted budget; path; gradient space ---------------


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


def test_costs_change_the_choice():
    K, beta = example()
    cheap3 = solve_kmm(K, beta, budget=0.5, costs=np.array([1.0, 1.0, 0.1]))
    dear3 = solve_kmm(K, beta, budget=0.5, costs=np.array([1.0, 1.0, 10.0]))
    assert cheap3.w[2] > 0.5 and abs(dear3.w[2]) < abs(cheap3.w[2])
    with pytest.raises(KMMInputError, match="costs must be finite and > 0"):
        solve_kmm(K, beta, budget=1.0, costs=np.array([1.0, 0.0, 1.0]))


def test_path_gives_exact_solutions_and_every_top_k():
    from convalue.solvers import kmm_path

    K, beta = random_problem(5, 30, 12, True)
    path = kmm_path(K, beta, n_gammas=25)
    assert np.all(path.kkt < 1e-8)
    assert np.all(np.diff(path.l1) >= -1e-9)  # ||w||_1 grows as gamma falls
    mid = 12
    ref = solve_kmm(K, beta, gamma=float(path.gammas[mid]), method="cvxpy")
    assert make_problem(K, beta, gamma=float(path.gammas[mid])).objective(path.W[mid]) <= ref.objective + 1e-9
    sel = path.selections([1, 2, 3])
    assert [len(v) for v in sel.values()] == [1, 2, 3]
    assert sel[1][0] in sel[3]


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"gammas": [0.1, -0.5]}, r"gammas\[1\] must be a finite number >= 0, got -0\.5"),
        ({"gammas": np.array([np.nan, 0.1])}, r"gammas\[0\] must be .*, got nan"),  # was certified with KKT 0
        ({"gammas": ["a"]}, r"gammas\[0\] must be .*, got 'a'"),
        ({"gammas": []}, "non-empty 1-d"),
        ({"gamma_min_ratio": 0.0}, "gamma_min_ratio must be a finite number > 0"),
        ({"n_gammas": 0}, "n_gammas must be a positive integer"),
    ],
)
def test_path_refuses_bad_gammas(kw, match):
    from convalue.solvers import kmm_path

    K, beta = random_problem(5, 12, 8, True)
    with pytest.raises(KMMInputError, match=match):
        kmm_path(K, beta, **kw)


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


def test_large_indefinite_matrix_is_rejected_without_a_dense_eigendecomposition():
    K = np.eye(3001)
    K[17, 18] = K[18, 17] = 2.0  # the block [[1, 2], [2, 1]] has eigenvalue -1; every K_ii is 1
    with pytest.raises(KMMInputError, match=r"most negative eigenvalue at most -1 \(a LOBPCG estimate\)"):
        make_problem(K, np.ones(3001), gamma=0.1)


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
    assert op.float32_copy().dtype == np.float32 and op.float32_copy() is op.float32_copy()  # made once
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


def _recorded(fn, log: list, entry):
    """fn, appending entry(*args, **kwargs) to log before each call: a spy that records what each call was given."""
    def recorded(*args, **kwargs):
        log.append(entry(*args, **kwargs))
        return fn(*args, **kwargs)
    return recorded


def _near_parallel(rng: np.random.Generator, n: int, p: int, mix: int = 5) -> tuple[np.ndarray, np.ndarray]:
    """Unit rows 1 + 0.02 noise (K has one eigenvalue near n) and a target the mean of the first `mix` of them."""
    G = 1.0 + 0.02 * rng.normal(size=(n, p))
    G /= np.linalg.norm(G, axis=1, keepdims=True)
    return G, G[:mix].mean(axis=0)


def _clustered(n: int, p: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Unit-norm gradients in n // 20 clusters of near-duplicates and a target mixing a few centres."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(n // 20, p))
    G = centers[rng.integers(0, n // 20, size=n)] + 0.35 * rng.normal(size=(n, p)) / np.sqrt(p) * np.linalg.norm(
        centers, axis=1).mean()
    G /= np.linalg.norm(G, axis=1, keepdims=True)
    g = centers[:5].sum(axis=0) + 0.5 * rng.normal(size=p)
    return G, g / np.linalg.norm(g)


def _certificate_gap(K: np.ndarray, w: np.ndarray, kkt_a: float, kkt_b: float) -> float:
    """The most two answers with KKT violations kkt_a and kkt_b can differ by in the 2-norm on a positive definite K:
    the objective is lambda_min(K)-strongly convex, so each lies within sqrt(N) kkt / lambda_min of the optimum."""
    lam = float(np.linalg.eigvalsh(K)[0])
    assert lam > 0, "the bound needs a positive definite K"
    return np.sqrt(len(w)) * (kkt_a + kkt_b) / lam


def _assert_far_from_a_support_change(K: np.ndarray, beta: np.ndarray, gamma: float, w: np.ndarray,
                                      margin: float = 1e-6) -> None:
    """The optimum w is far from a change of support or signs: every inactive |r_i| (r = K w - beta) lies at least
    margin gamma below gamma and every active |w_i| is at least margin max|w|. Round-off (about 1e-13 here) then
    cannot move a candidate in or out, so exact methods (LARS, support solves) take the same steps on any BLAS and
    certify at 1e-10: a test may assert which of them answered."""
    r = K @ w - beta
    on = w != 0
    assert gamma - np.abs(r[~on]).max(initial=0.0) >= margin * gamma
    assert np.abs(w[on]).min(initial=np.inf) >= margin * np.abs(w).max()


# --- rank-deficient K (N > p, duplicates): the homotopy ---------------------------------------------------


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


def test_path_on_rank_deficient_k_is_read_off_one_homotopy(monkeypatch):
    """An affordable rank-deficient K's path is read off one homotopy: every point certifies at 1e-10 from it (LARS
    is exact to round-off, about 1e-13 here), so no point needs a solve of its own."""
    import convalue.solvers.path as path_module
    from convalue.solvers import kmm_path

    G, g = random_gradients(6, 300, 100, False)
    K, beta = G @ G.T, G @ g

    def no_single_solves(*args, **kwargs):
        raise AssertionError("every point of this path should come from the homotopy")

    monkeypatch.setattr(path_module, "solve_penalised", no_single_solves)
    path = kmm_path(K, beta, n_gammas=20)
    assert np.all(path.kkt <= 1e-10 * max(1.0, float(np.abs(beta).max())))
    assert np.all(np.diff(path.l1) >= -1e-12)
    for t in (3, 12, 19):
        single = solve_kmm(K, beta, gamma=float(path.gammas[t]))
        assert make_problem(K, beta, gamma=float(path.gammas[t])).objective(path.W[t]) == pytest.approx(
            single.objective, rel=1e-10, abs=1e-12)


def test_an_unconverged_solve_returns_the_closest_iterate_any_strategy_reached(monkeypatch):
    """When every step fails (each one faked here), the fallbacks start from (and return) the iterate with the
    smallest KKT violation: the first ADMM run's, not a later run's zero start."""
    import convalue.solvers.active_set as AS
    import convalue.solvers.admm as admm_module
    import convalue.solvers.reference as ref_module
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
    monkeypatch.setattr(ref_module, "solve_cvxpy", lambda problem, tolerance: (np.zeros(problem.n), {}))
    monkeypatch.setattr(WS, "working_set_homotopy", lambda op, *a, **k: (np.zeros(op.n), 0, False))
    w, info = solve_penalised(GramOperator(K, beta), gamma)  # rank unknown: the ADMM chain
    # ADMM's first steps, then its rho and the policy's retries in full
    assert len(calls) == 2 + len(DEFAULT_POLICY.admm.rho_retries) and not info["converged"]
    assert info["fallback"] == "coordinate_descent+nnls_polish"  # every fallback ran, in the plan's order
    assert np.array_equal(w, good)


# --- sparse solutions where plain PDAS fails: the divergence stop and the working-set homotopy --------------


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
