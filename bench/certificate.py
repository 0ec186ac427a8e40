"""The benches' check of an answer: the penalised problem's KKT violation and objective at w, through the operator."""

from __future__ import annotations

import numpy as np

from convalue.solvers.active_set import kkt_from, residual
from convalue.solvers.problem import objective_from_residual


def penalised(op, gamma: float, w: np.ndarray) -> tuple[float, float]:
    """(largest KKT violation, objective 0.5 w'Kw - beta'w + gamma ||w||_1) at w, from one product K w."""
    r = residual(op, w)
    return kkt_from(w, r, gamma), objective_from_residual(w, r, op.beta, gamma * float(np.abs(w).sum()))


def budget(op, multiplier: float, w: np.ndarray) -> tuple[float, float]:
    """(largest KKT violation of the penalised problem at the budget's multiplier, objective 0.5 w'Kw - beta'w)."""
    r = residual(op, w)
    return kkt_from(w, r, multiplier), objective_from_residual(w, r, op.beta, 0.0)


def same_objective(a: float, b: float) -> bool:
    """True when two objectives agree to 1e-9, relative (absolute below 1)."""
    return abs(a - b) <= 1e-9 * max(1.0, abs(a))
