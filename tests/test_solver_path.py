"""The KMM regularisation path: exact points, every top-k, bad gammas, rank-deficient K."""

from __future__ import annotations

import numpy as np
import pytest
from solver_helpers import random_gradients, random_problem

from convalue.solvers import KMMInputError, make_problem, solve_kmm


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
