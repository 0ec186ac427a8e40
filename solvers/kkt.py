"""Optimality certificates for the KMM problem: largest KKT violation."""

from __future__ import annotations

import numpy as np

from solvers.problem import KMMProblem, gram_times


def kkt_violation(problem: KMMProblem, w: np.ndarray, *, zero_tol: float = 1e-10) -> float:
    """Largest violation of the KKT conditions of `problem` at w (0 at an exact optimum).

    Penalised form: with r = K w - beta, r_i = -gamma sign(w_i) on the support and |r_i| <= gamma off it.
    Budget form: the same with gamma replaced by the multiplier lambda >= 0 of ||w||_1 <= k,
    plus primal feasibility and complementary slackness lambda (k - ||w||_1) = 0.
    """
    problem, c = problem.unit_cost()  # costs: check the equivalent problem in v = c * w
    w = np.asarray(w, dtype=np.float64) * c
    r = gram_times(problem.K, w) - problem.beta
    scale = max(float(np.abs(w).max()), 1.0) * zero_tol
    support = np.abs(w) > scale
    if problem.gamma is not None:
        lam = problem.gamma
        infeas = 0.0
        slack = 0.0
    else:
        l1 = float(np.abs(w).sum())
        infeas = max(0.0, l1 - problem.budget)
        # multiplier estimate: at the optimum every support coordinate has |r_i| = lambda
        lam = float(np.abs(r[support]).mean()) if support.any() else 0.0
        if l1 < problem.budget * (1 - 1e-6):
            lam = 0.0
        slack = lam * max(0.0, problem.budget - l1)
    stat_on = np.abs(r[support] + lam * np.sign(w[support]))
    stat_off = np.maximum(np.abs(r[~support]) - lam, 0.0)
    worst = max(
        float(stat_on.max()) if stat_on.size else 0.0,
        float(stat_off.max()) if stat_off.size else 0.0,
    )
    return max(worst, infeas, slack)
