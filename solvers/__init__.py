"""Kernel Mean Matching solvers for dataset valuation; no models, no Ray."""

from solvers.api import KMMSolution, solve_kmm, solve_problem
from solvers.kkt import kkt_violation
from solvers.problem import KMMInputError, KMMProblem, KMMSolveError, make_problem

__all__ = [
    "KMMInputError",
    "KMMProblem",
    "KMMSolution",
    "KMMSolveError",
    "kkt_violation",
    "make_problem",
    "solve_kmm",
    "solve_problem",
]
