"""Public entry point: solve_kmm and its certified result."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from solvers.kkt import kkt_violation
from solvers.problem import KMMProblem, make_problem
from solvers.reference import solve_cvxpy

METHODS = ("auto", "cvxpy")


@dataclass(frozen=True)
class KMMSolution:
    """Scores w with their certificate: objective, status, largest KKT violation, iterations, time."""

    w: np.ndarray
    objective: float
    status: str
    kkt: float
    form: str
    gamma: float | None
    budget: float | None
    method: str
    iterations: int | None = None
    time_s: float = 0.0
    info: dict = field(default_factory=dict)

    def summary(self) -> dict:
        """JSON-ready description of the solve (everything except w)."""
        return {
            "form": self.form,
            "gamma": self.gamma,
            "budget": self.budget,
            "method": self.method,
            "status": self.status,
            "objective": self.objective,
            "kkt": self.kkt,
            "iterations": self.iterations,
            "time_s": self.time_s,
            "nnz": int(np.count_nonzero(np.abs(self.w) > 1e-9)),
            "l1": float(np.abs(self.w).sum()),
        }


def solve_problem(problem: KMMProblem, *, method: str = "auto") -> KMMSolution:
    """Solve a validated KMMProblem with the named method."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    t0 = time.perf_counter()
    w, info = solve_cvxpy(problem, tolerance="tight")
    elapsed = time.perf_counter() - t0
    return KMMSolution(
        w=w,
        objective=problem.objective(w),
        status=info["status"],
        kkt=kkt_violation(problem, w),
        form=problem.form,
        gamma=problem.gamma,
        budget=problem.budget,
        method=info["method"],
        iterations=info.get("iterations"),
        time_s=elapsed,
        info=info,
    )


def solve_kmm(
    K: np.ndarray,
    beta: np.ndarray,
    *,
    gamma: float | None = None,
    budget: float | None = None,
    method: str = "auto",
    normalize: str = "none",
) -> KMMSolution:
    """Solve KMM (paper eq. kmm_l1_penalized with gamma, or eq. kmm_qp with ||w||_1 <= budget)."""
    problem = make_problem(K, beta, gamma=gamma, budget=budget, normalize=normalize)
    return solve_problem(problem, method=method)
