"""Optimality certificates for the KMM problem: largest KKT violation, and the objective from the same product."""

from __future__ import annotations

import numpy as np

from convalue.solvers.problem import KMMProblem, gram_times, objective_from_residual


def _violation(problem: KMMProblem, v: np.ndarray, r: np.ndarray, zero_tol: float) -> float:
    """Largest KKT violation of a unit-cost problem at v, given r = K v - beta."""
    scale = max(float(np.abs(v).max()), 1.0) * zero_tol
    support = np.abs(v) > scale
    if problem.gamma is not None:
        lam = problem.gamma
        infeas = 0.0
        slack = 0.0
    else:
        l1 = float(np.abs(v).sum())
        infeas = max(0.0, l1 - problem.budget)
        # multiplier estimate: at the optimum every support coordinate has |r_i| = lambda
        lam = float(np.abs(r[support]).mean()) if support.any() else 0.0
        if l1 < problem.budget * (1 - 1e-6):
            lam = 0.0
        slack = lam * max(0.0, problem.budget - l1)
    stat_on = np.abs(r[support] + lam * np.sign(v[support]))
    stat_off = np.maximum(np.abs(r[~support]) - lam, 0.0)
    worst = max(
        float(stat_on.max()) if stat_on.size else 0.0,
        float(stat_off.max()) if stat_off.size else 0.0,
    )
    return max(worst, infeas, slack)


def kkt_violation(problem: KMMProblem, w: np.ndarray, *, zero_tol: float = 1e-10) -> float:
    """Largest violation of the KKT conditions of `problem` at w (0 at an exact optimum).

    Penalised form: with r = K w - beta, r_i = -gamma sign(w_i) on the support and |r_i| <= gamma off it.
    Budget form: the same with gamma replaced by the multiplier lambda >= 0 of ||w||_1 <= k,
    plus primal feasibility and complementary slackness lambda (k - ||w||_1) = 0.
    """
    return certify(problem, w, zero_tol=zero_tol)[0]


def certify(problem: KMMProblem, w: np.ndarray, *, zero_tol: float = 1e-10) -> tuple[float, float]:
    """(largest KKT violation, objective) of `problem` at w, from one product K w (see kkt_violation)."""
    unit, c = problem.unit_cost()  # costs: check the equivalent problem in v = c * w
    v = np.asarray(w, dtype=np.float64) * c
    r = gram_times(unit.K, v) - unit.beta
    # the cost-weighted l1 of w is the plain l1 of v
    penalty = unit.gamma * float(np.abs(v).sum()) if unit.gamma is not None else 0.0
    return _violation(unit, v, r, zero_tol), objective_from_residual(v, r, unit.beta, penalty)
