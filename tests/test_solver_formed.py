"""A K the caller formed as G G^T: validation in O(N^2) without the spectral check, and what it still refuses."""

from __future__ import annotations

import numpy as np
import pytest
from solver_helpers import _clustered, _recorded, random_gradients

from convalue.solvers import KMMInputError, kmm_path, make_problem, solve_kmm


def _spy_spectral(monkeypatch) -> list:
    """Record every O(N^3) or iterative spectral call validation can make (both Cholesky factors, eigvalsh,
    LOBPCG): a formed K must make none of them."""
    import scipy.linalg as sla

    import convalue.solvers.problem as problem_module

    calls = []
    for name in ("dpotrf", "dpstrf"):
        monkeypatch.setattr(problem_module.sla.lapack, name,
                            _recorded(getattr(sla.lapack, name), calls, lambda *a, name=name, **k: name))
    monkeypatch.setattr(problem_module.np.linalg, "eigvalsh",
                        _recorded(np.linalg.eigvalsh, calls, lambda *a, **k: "eigvalsh"))
    monkeypatch.setattr(problem_module, "ritz_floor",
                        _recorded(problem_module.ritz_floor, calls, lambda *a, **k: "lobpcg"))
    return calls


def test_a_formed_k_skips_the_spectral_check_and_gets_the_same_certified_answer(monkeypatch):
    """formed=True: no factor, no eigvalsh, no LOBPCG (counted by spies), the facts say so, and the answer is the
    one a fully validated K gets, certified at round-off. The same K from outside pays for the factors."""
    calls = _spy_spectral(monkeypatch)
    G, g = _clustered(400, 100, seed=4)  # N > p: rank-deficient, the pivoted factor's case
    K, beta = G @ G.T, G @ g
    formed = make_problem(K, beta, gamma=1e-3, rank_bound=100, formed=True)
    assert calls == []
    assert formed.checks == {"formed": True, "psd": "formed", "spectral": False, "duplicates": 0, "rank": "bound"}
    assert formed.rank == 100 and formed.K is K  # numpy's G @ G.T is exactly symmetric: kept, not copied
    checked = make_problem(K, beta, gamma=1e-3, rank_bound=100)
    assert calls and checked.checks["spectral"] and checked.checks["psd"] in ("cholesky", "pivoted_cholesky")
    calls.clear()
    a = solve_kmm(K, beta, gamma=1e-3, rank_bound=100, formed=True)
    assert calls == []
    b = solve_kmm(K, beta, gamma=1e-3, rank_bound=100)
    scale = max(1.0, float(np.abs(beta).max()))
    assert a.status == b.status == "optimal" and max(a.kkt, b.kkt) <= 1e-10 * scale
    assert a.objective == pytest.approx(b.objective, rel=1e-12, abs=1e-14)
    G, g = _clustered(150, 300, seed=4)  # kmm_path takes no rank bound: a full-rank K
    calls.clear()
    path = kmm_path(G @ G.T, G @ g, n_gammas=3, formed=True)
    assert calls == [] and path.kkt.max() <= 1e-10 * max(1.0, float(np.abs(G @ g).max()))


def test_a_formed_k_counts_its_duplicates_and_bounds_the_rank_by_them():
    """Exact duplicates (and negations) are counted in O(N^2): the rank is at most the distinct count, and at most
    the caller's bound."""
    G, g = random_gradients(3, 60, 80, True)  # N < p, candidate 1 duplicates candidate 0
    G[7] = -G[5]  # a negated copy: the same column of K up to sign
    K, beta = G @ G.T, G @ g
    prob = make_problem(K, beta, gamma=0.1, formed=True)
    assert prob.checks["duplicates"] == 2 and prob.rank == 58 and prob.checks["rank"] == "distinct"
    assert make_problem(K, beta, gamma=0.1, formed=True, rank_bound=40).rank == 40
    G, g = random_gradients(3, 60, 80, False)
    prob = make_problem(G @ G.T, G @ g, gamma=0.1, formed=True)
    assert prob.checks["duplicates"] == 0 and prob.rank is None and prob.checks["rank"] is None  # unknown: N


@pytest.mark.parametrize(("K", "match"), [
    (np.array([[1.0, np.nan], [np.nan, 1.0]]), r"K contains NaN or inf"),
    (np.array([[1.0, 0.5], [0.0, 1.0]]), "not symmetric"),
    (np.diag([1.0, 0.0]), "zero-norm"),
    (np.diag([-1.0, 1.0]), r"negative diagonal entry, first K\[0, 0\] = -1"),
])
def test_a_formed_k_is_still_refused_for_what_construction_cannot_guarantee(K, match):
    """A non-finite G gives a non-finite K, an unsymmetric assembly an unsymmetric K, a zero row a zero K_ii."""
    with pytest.raises(KMMInputError, match=match):
        solve_kmm(K, np.ones(2), gamma=0.1, formed=True)


def test_a_k_from_outside_still_gets_the_spectral_check(monkeypatch):
    """An indefinite K passes the formed check (the caller vouched that it is G G^T: construction guarantees what a
    spectral check or Cauchy-Schwarz would find) and is refused without formed=True, by the spectral check the
    spies see run."""
    beta = np.ones(3)
    calls = _spy_spectral(monkeypatch)
    for indefinite, lam in ((np.array([[1.0, 0.9, 0.9], [0.9, 1.0, -0.9], [0.9, -0.9, 1.0]]), -0.8),
                            (np.array([[1.0, 2.0, 0.0], [2.0, 1.0, 0.0], [0.0, 0.0, 1.0]]), -1.0)):  # no Gram matrix
        assert np.linalg.eigvalsh(indefinite)[0] == pytest.approx(lam)
        calls.clear()
        assert make_problem(indefinite, beta, gamma=0.1, formed=True).checks["psd"] == "formed" and calls == []
        with pytest.raises(KMMInputError, match="not positive semidefinite: most negative eigenvalue"):
            solve_kmm(indefinite, beta, gamma=0.1)
        assert "dpotrf" in calls


def test_a_formed_k_that_is_not_exactly_symmetric_is_symmetrised_like_any_other():
    """Within sym_tol, 0.5 (K + K^T) is solved (a copy), as without formed=True."""
    G, g = random_gradients(6, 30, 40, False)
    K = G @ G.T
    K[29, 3] += 1e-9 * float(np.abs(K).max())
    prob = make_problem(K, G @ g, gamma=0.1, formed=True)
    assert prob.K is not K and np.array_equal(prob.K, 0.5 * (K + K.T))
