"""solver.gamma_ratio: gamma as a fraction of the smallest gamma that zeroes every score, in the beta the solver sees
(the run's metric, cosine normalisation, prices)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from convalue.engine.config import FeaturesConfig, SolverConfig
from convalue.engine.selection.solve import SolveSpec

SETTINGS = [(normalize, costs, space) for normalize in ("none", "cosine") for costs in (False, True)
            for space in ("gram", "gradients")]


def vectors(seed: int = 0, n: int = 24, p: int = 16) -> tuple[np.ndarray, np.ndarray]:
    """Group vectors of unequal norms around a shared direction, and a target."""
    rng = np.random.default_rng(seed)
    base = rng.standard_normal(p)
    G = (0.5 * base + rng.standard_normal((n, p))) * rng.uniform(0.2, 3.0, (n, 1))
    return G, base + 0.3 * rng.standard_normal(p)


def spec(normalize: str, costs: bool, space: str, n: int = 24, **form) -> SolveSpec:
    prices = np.random.default_rng(1).uniform(0.5, 2.0, n) if costs else None
    return SolveSpec(normalize=normalize, costs=prices, space=space, rank_bound=16, **form)


def by_hand(s: SolveSpec, G: np.ndarray, g_tar: np.ndarray) -> float:
    """max_i |beta_i| / (c_i sqrt(K_ii)), written out."""
    beta, diag = G @ g_tar, (G * G).sum(1)
    scaled = np.abs(beta) / (np.sqrt(diag) if s.normalize == "cosine" else 1.0)
    return float((scaled / (s.costs if s.costs is not None else 1.0)).max())


@pytest.mark.parametrize(("normalize", "costs", "space"), SETTINGS)
def test_a_ratio_solves_as_the_absolute_gamma_it_stands_for(normalize, costs, space):
    G, g_tar = vectors()
    ratio = spec(normalize, costs, space, gamma_ratio=0.2)
    problem = ratio.problem(G, g_tar)
    gamma = 0.2 * by_hand(ratio, G, g_tar)
    assert ratio.absolute_gamma(problem) == pytest.approx(gamma, rel=1e-12)
    got = ratio.solve(problem)
    want = spec(normalize, costs, space, gamma=gamma).solve(problem)
    assert got.gamma == pytest.approx(gamma, rel=1e-12)  # the solution records the absolute gamma it used
    assert np.count_nonzero(got.w) > 0
    np.testing.assert_allclose(got.w, want.w, rtol=1e-9, atol=1e-12)
    resolved = ratio.resolved(problem.beta, (G * G).sum(1))
    assert (resolved.gamma_ratio, resolved.gamma) == (None, pytest.approx(gamma, rel=1e-12))
    assert spec(normalize, costs, space, gamma=0.3).absolute_gamma(problem) == 0.3


@pytest.mark.parametrize(("normalize", "costs", "space"), SETTINGS)
def test_a_ratio_of_one_or_more_zeroes_every_score_and_just_below_does_not(normalize, costs, space):
    G, g_tar = vectors(seed=2)
    for r in (1.0, 1.5):
        s = spec(normalize, costs, space, gamma_ratio=r)
        assert not np.any(s.solve(s.problem(G, g_tar)).w)
    s = spec(normalize, costs, space, gamma_ratio=0.999)
    assert np.count_nonzero(s.solve(s.problem(G, g_tar)).w) == 1  # the candidate at the max enters first


def test_the_config_s_ratio_reaches_the_solve_spec():
    cfg = SimpleNamespace(solver=SolverConfig(gamma_ratio=0.25, normalize="cosine"), features=FeaturesConfig())
    cfg.solver.validate()
    s = SolveSpec.from_config(cfg, costs=None, rank_bound=16, space="gram")
    assert (s.gamma, s.gamma_ratio, s.budget, s.normalize) == (None, 0.25, None, "cosine")
    G, g_tar = vectors()
    assert s.solve_gram(G @ G.T, G @ g_tar).gamma == pytest.approx(0.25 * by_hand(s, G, g_tar))
