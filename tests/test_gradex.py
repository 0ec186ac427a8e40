"""GradEx: the log-odds reduction is exact at theta*, and FS / RE rank a planted linear-in-theta case correctly."""

from __future__ import annotations

import numpy as np
import pytest

from convalue.engine.features.losses import mean_token_log_odds
from convalue.engine.protocol.gradex import (
    GradEx,
    LinearisedSet,
    ensemble_subsets,
    fit_surrogate,
    forward_selection,
    log_odds,
    logistic_loss,
    random_ensemble,
    stack,
    surrogate_loss,
)

E = np.eye(4)


def examples(direction: np.ndarray, n: int, f0: float = 0.0) -> LinearisedSet:
    """n examples whose log-odds are f0 + direction^T (theta - theta*): a model linear in theta, so the
    linearisation, and with it the surrogate, is exact."""
    return LinearisedSet(np.tile(direction, (n, 1)), np.full(n, f0))


def test_cross_entropy_is_the_logistic_loss_of_the_log_odds():
    rng = np.random.default_rng(0)
    logits = rng.normal(scale=3.0, size=(50, 7))
    logp = logits[np.arange(50), rng.integers(7, size=50)] - np.logaddexp.reduce(logits, axis=1)
    assert np.allclose(logistic_loss(log_odds(logp)), -logp, rtol=1e-12, atol=1e-12)
    assert np.isfinite(log_odds(np.array([-1e-20, -800.0]))).all()  # p near 1 and near 0


def test_surrogate_equals_the_true_loss_at_theta_star_and_agrees_to_first_order():
    """A softmax classifier (not linear in theta): at theta* the surrogate is the summed cross-entropy exactly;
    a step of size eps away it is off by O(eps^2)."""
    import torch

    torch.manual_seed(0)
    x, y = torch.randn(12, 5, dtype=torch.float64), torch.randint(0, 3, (12,))
    theta = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    valid = torch.ones(12, 1, dtype=torch.bool)

    def ce(th):
        return torch.nn.functional.cross_entropy(x @ th.T, y, reduction="sum")

    f = mean_token_log_odds(x @ theta.T, y, valid)  # one "token" per example
    phi = np.stack([torch.autograd.grad(f[i], theta, retain_graph=True)[0].reshape(-1).numpy() for i in range(12)])
    train = LinearisedSet(phi, f.detach().numpy())
    assert surrogate_loss(np.zeros(15), train) == pytest.approx(float(ce(theta.detach())), rel=1e-6)
    direction = torch.randn(3, 5, dtype=torch.float64)
    gaps = []
    for eps in (1e-2, 1e-3):
        true = float(ce(theta.detach() + eps * direction))
        gaps.append(abs(surrogate_loss(eps * direction.reshape(-1).numpy(), train) - true))
    assert gaps[1] < gaps[0] / 50  # quadratic, not linear, in eps


def test_fit_surrogate_reaches_the_minimum():
    rng = np.random.default_rng(1)
    train = LinearisedSet(rng.normal(size=(30, 6)), rng.normal(size=30))
    v = fit_surrogate(train, l2=0.5)
    for _ in range(30):
        assert surrogate_loss(v, train, 0.5) <= surrogate_loss(v + rng.normal(scale=1e-4, size=6), train, 0.5)


def planted() -> GradEx:
    """Target along e1; candidates: 0 strongly helpful (e1, 20 examples), 1 weakly helpful (e1, 5), 2 harmful
    (-e1), 3 neutral (e2, orthogonal to the target)."""
    return GradEx(examples(E[0], 20), examples(E[0], 10),
                  [examples(E[0], 20), examples(E[0], 5), examples(-E[0], 20), examples(E[1], 20)])


def test_forward_selection_picks_the_best_group_first_and_stops_without_improvement():
    gx = planted()
    fs = forward_selection(gx)
    assert fs.order == (0, 1)  # the strong helper first; then the weak one; harm and neutral never
    assert all(g > 0 for g in fs.gains) and np.allclose(np.diff(fs.evals), fs.gains)
    assert fs.evals[0] == gx.evaluate(()) and fs.evals[-1] == pytest.approx(gx.evaluate((0, 1)))
    assert fs.scores[0] > fs.scores[1] > 0 >= fs.scores[3] > fs.scores[2]
    assert gx.evaluate((3,)) == pytest.approx(gx.evaluate(()), abs=1e-12)  # the neutral group changes nothing
    assert forward_selection(gx, max_size=1).order == (0,)


def test_random_ensemble_scores_agree_in_sign_with_the_planted_truth():
    candidates = [examples(E[0], 10), examples(E[0], 10), examples(-0.3 * E[0], 5), examples(-0.3 * E[0], 5),
                  examples(E[2], 10), examples(E[3], 10)]
    gx = GradEx(examples(E[0], 20), examples(E[0], 10), candidates)
    truth = np.array([gx.evaluate((i,)) - gx.evaluate(()) for i in range(6)])
    assert list(np.sign(truth)) == [1, 1, -1, -1, 0, 0]
    for seed in range(3):
        subsets = ensemble_subsets(6, seed=seed)
        assert len(subsets) == 60 and all(len(s) == 3 for s in subsets)  # 10 N subsets of round(N / 2)
        w = random_ensemble(gx, subsets)
        assert np.all(w[:2] > 0) and np.all(w[2:4] < 0)
        raw = random_ensemble(gx, subsets, centre=False)  # eq. gradex_re_score itself: a shift of w
        assert np.allclose(raw - w, gx.evaluate(()))
        for i in range(6):
            assert raw[i] == pytest.approx(np.mean([gx.evaluate(s) for s in subsets if i in s]))


def test_inputs_are_checked():
    with pytest.raises(ValueError, match="rows"):
        LinearisedSet(np.zeros((3, 2)), np.zeros(4))
    with pytest.raises(ValueError, match="projection dimension"):
        GradEx(examples(E[0], 2), examples(E[0], 2), [LinearisedSet(np.zeros((2, 3)), np.zeros(2))])
    with pytest.raises(ValueError, match="no sampled subset"):
        random_ensemble(planted(), [(0, 1)])
    assert stack([examples(E[0], 2), examples(E[1], 3)]).phi.shape == (5, 4)
