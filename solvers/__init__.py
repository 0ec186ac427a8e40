"""Kernel Mean Matching solvers for dataset valuation; no models, no Ray."""

from convalue.solvers.api import METHODS, KMMSolution, solve_kmm, solve_kmm_gradients, solve_problem
from convalue.solvers.kkt import kkt_violation
from convalue.solvers.path import KMMPath, kmm_path
from convalue.solvers.plan import BudgetFacts, PenalisedFacts, plan_budget, plan_penalised
from convalue.solvers.policy import DEFAULT_POLICY, SolverPolicy
from convalue.solvers.problem import KMMInputError, KMMProblem, KMMSolveError, make_problem

__all__ = [
    "DEFAULT_POLICY",
    "METHODS",
    "BudgetFacts",
    "KMMInputError",
    "KMMPath",
    "KMMProblem",
    "KMMSolution",
    "KMMSolveError",
    "PenalisedFacts",
    "SolverPolicy",
    "kkt_violation",
    "kmm_path",
    "make_problem",
    "plan_budget",
    "plan_penalised",
    "solve_kmm",
    "solve_kmm_gradients",
    "solve_problem",
]
