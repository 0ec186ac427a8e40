"""Public entry points: solve_kmm (from K), solve_kmm_gradients (from G; K formed on active sets), the result."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from convalue.solvers.active_set import kkt_of, residual
from convalue.solvers.budget import solve_budget
from convalue.solvers.homotopy import deduplicated, expand
from convalue.solvers.kkt import certify
from convalue.solvers.operators import GradientOperator, GramOperator
from convalue.solvers.penalised import prefers_gram_form, solve_penalised
from convalue.solvers.policy import DEFAULT_POLICY, SolverPolicy
from convalue.solvers.problem import (
    KMMInputError,
    KMMProblem,
    KMMSolveError,
    check_costs,
    check_finite,
    check_normalize,
    check_norms,
    check_settings,
    check_tol,
    make_problem,
    objective_from_residual,
)
from convalue.solvers.reference import solve_cvxpy
from convalue.solvers.threads import blas_threads

METHODS = ("auto", "active_set", "cvxpy", "cvxpy_paper")
#: the contract of "optimal": the largest KKT violation, relative to max(1, max|beta|), of a certified answer
KKT_TOL = 1e-6
#: the solver info a solution's summary carries
_SUMMARY_INFO = ("fallback", "multiplier", "binding", "gram_formed", "tol", "early_stop")


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
            "nnz": int(np.count_nonzero(self.w)),
            "l1": float(np.abs(self.w).sum()),
        } | {k: v for k, v in self.info.items() if k in _SUMMARY_INFO}


def _scaled(op, c: np.ndarray | None):
    """The operator of the unit-cost problem in v = c * w: K / (c c^T), beta / c."""
    if c is None:
        return op
    if isinstance(op, GradientOperator):
        return GradientOperator(op.G / c[:, None], op.g, linalg=op.linalg)
    return GramOperator(op.K / np.outer(c, c), op.beta / c, rank=op.rank_bound, linalg=op.linalg)


def _active_set(op, problem_like: KMMProblem, tol: float | None,
                policy: SolverPolicy) -> tuple[np.ndarray, dict, object]:
    """(w, info, the unit-cost operator it solved on); tol: see solve_kmm."""
    c = problem_like.costs
    inner = _scaled(op, c)
    distinct, keep = deduplicated(inner, policy)  # one candidate per duplicate group for the homotopy; the rest get 0
    with blas_threads(inner.n, policy.linalg.single_thread_max_n):
        if problem_like.gamma is not None:
            gram_formed = prefers_gram_form(distinct, problem_like.gamma, policy)
            v, info = solve_penalised(distinct.gram() if gram_formed else distinct, problem_like.gamma, stop_tol=tol,
                                      policy=policy)
            info["multiplier"] = problem_like.gamma
            if gram_formed:
                info["gram_formed"] = True
        else:
            v, info = solve_budget(distinct, problem_like.budget, policy=policy)
            info["multiplier"] = info["gamma"]
    if tol is not None:
        info["tol"] = tol
    v = expand(v, keep, inner.n)
    w = v if c is None else v / c
    return w, info, inner


def _status(kkt: float, beta: np.ndarray, converged: bool, tol: float | None = None) -> str:
    ok = kkt <= max(KKT_TOL, tol or 0.0) * max(1.0, float(np.abs(beta).max()))
    return "optimal" if ok and converged else "inaccurate"


def solve_problem(problem: KMMProblem, *, method: str = "auto", tol: float | None = None,
                  policy: SolverPolicy = DEFAULT_POLICY) -> KMMSolution:
    """Solve a validated KMMProblem with the named method (tol, policy: see solve_kmm); raise KMMSolveError if it does
    not converge."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    tol = check_tol(tol, problem.gamma)
    if tol is not None and method in ("cvxpy", "cvxpy_paper"):
        raise KMMInputError(f"tol applies to convalue's solver, not to method {method!r} (OSQP has its own settings)")
    t0 = time.perf_counter()
    if method in ("cvxpy", "cvxpy_paper"):
        w, info = solve_cvxpy(problem, tolerance="paper" if method == "cvxpy_paper" else "tight")
        status = info["status"]
        name = info["method"]
        iters = info.get("iterations")
    else:
        op = GramOperator(problem.K, problem.beta, rank=problem.rank, linalg=policy.linalg)
        w, info, _ = _active_set(op, problem, tol, policy)
        name = "active_set"
        iters = info["iterations"]
        status = None
    elapsed = time.perf_counter() - t0
    with blas_threads(problem.n, policy.linalg.single_thread_max_n):
        kkt, objective = certify(problem, w)
    if status is None:
        status = _status(kkt, problem.beta, info.get("converged", True), tol)
        if status != "optimal":
            raise KMMSolveError(f"active-set KMM solver did not converge: KKT violation {kkt:.3g} "
                                f"after {iters} iterations (try solver.method: cvxpy)")
    return KMMSolution(w=w, objective=objective, status=status, kkt=kkt, form=problem.form,
                       gamma=problem.gamma, budget=problem.budget, method=name, iterations=iters,
                       time_s=elapsed, info=info)


def solve_kmm(
    K: np.ndarray,
    beta: np.ndarray,
    *,
    gamma: float | None = None,
    budget: float | None = None,
    costs: np.ndarray | None = None,
    method: str = "auto",
    normalize: str = "none",
    rank_bound: int | None = None,
    psd_tol: float = 1e-6,
    tol: float | None = None,
    formed: bool = False,
    policy: SolverPolicy = DEFAULT_POLICY,
) -> KMMSolution:
    """Solve KMM (paper eq. kmm_l1_penalized with gamma, eq. kmm_qp with budget; costs weight the l1 term).

    rank_bound: an upper bound on rank(K) when the caller knows one (p for K = G G^T with G of N x p); see
    make_problem. psd_tol: the most negative eigenvalue accepted, as a fraction of max |K_ij|.
    formed: True where the caller formed K as G G^T itself (PSD by construction): validation then checks only what
    can go wrong with such a K, in O(N^2), and skips the spectral check (see make_problem); pass rank_bound=p too.
    tol: None (default) solves exactly (KKT at round-off). A number in (0, 1e-3] lets the penalised form's ADMM stop
    at that KKT violation, relative to max(1, max|beta|), instead of polishing exact, where the polish costs more than
    finishing ADMM and K is well-conditioned enough for the tolerance to pin down the scores (the policy's
    early_stop section). The answer is certified either way (.kkt; info "early_stop" says where ADMM stopped); every
    other answer is exact, as is every answer for tol below early_stop.min_tol (float32's floor).
    policy: the thresholds that steer validation and the solver (convalue.solvers.policy; the default is measured).
    """
    problem = make_problem(K, beta, gamma=gamma, budget=budget, costs=costs, normalize=normalize,
                           rank_bound=rank_bound, psd_tol=psd_tol, formed=formed, policy=policy)
    return solve_problem(problem, method=method, tol=tol, policy=policy)


def solve_kmm_gradients(
    G: np.ndarray,
    g_tar: np.ndarray,
    *,
    gamma: float | None = None,
    budget: float | None = None,
    costs: np.ndarray | None = None,
    normalize: str = "none",
    tol: float | None = None,
    policy: SolverPolicy = DEFAULT_POLICY,
    overwrite_G: bool = False,
) -> KMMSolution:
    """Solve KMM from the gradients themselves (N x p rows): K = G G^T is formed only on the active set.

    The exception: at a dense gamma with N <= p, where K is no larger than G, K is formed once and the Gram form
    solves (convalue.solvers.plan.forms_gram); the solution's info says "gram_formed".

    normalize="cosine" divides every row by its norm: K_ij / sqrt(K_ii K_jj) and beta_i / sqrt(K_ii), as in
    make_problem. tol, policy: as in solve_kmm (early stops apply where K is formed). overwrite_G: G (float64,
    C-ordered) may be scaled in place, as scipy's overwrite_a; otherwise at most one float64 copy of G is made.
    """
    G = np.asarray(G)
    if G.dtype != np.float64 or not G.flags.c_contiguous or (
            normalize == "cosine" and not (overwrite_G and G.flags.writeable)):
        G = np.array(G, dtype=np.float64, order="C")  # one copy, ours to scale
    g_tar = np.asarray(g_tar, dtype=np.float64)
    if G.ndim != 2 or g_tar.ndim != 1 or G.shape[1] != g_tar.shape[0]:
        raise KMMInputError(f"G must be N x p and g_tar of length p, got {G.shape} and {g_tar.shape}")
    check_finite("G", G)
    check_finite("g_tar", g_tar)
    check_settings(gamma, budget)
    tol = check_tol(tol, gamma)
    check_normalize(normalize)
    op = GradientOperator(G, g_tar, linalg=policy.linalg)
    check_norms(op.diag, 0.0)
    if normalize == "cosine":
        np.divide(G, np.sqrt(op.diag)[:, None], out=G)  # the same rounding as G / sqrt(diag), without a copy
        op = GradientOperator(G, g_tar, linalg=policy.linalg)
    # no K here: the shell carries settings, beta and costs (for .l1 and .form)
    shell = KMMProblem(K=np.empty((0, 0)), beta=op.beta, gamma=gamma, budget=budget,
                       costs=check_costs(costs, op.n))
    t0 = time.perf_counter()
    w, info, inner = _active_set(op, shell, tol, policy)
    elapsed = time.perf_counter() - t0
    c = np.ones(op.n) if shell.costs is None else shell.costs
    # certify on the unit-cost problem in v = c * w; a non-binding budget has multiplier 0
    kkt = kkt_of(inner, info["multiplier"], w * c)
    r = residual(op, w)
    objective = objective_from_residual(w, r, op.beta, gamma * shell.l1(w) if gamma is not None else 0.0)
    status = _status(kkt, op.beta, info.get("converged", True), tol)
    if status != "optimal":
        raise KMMSolveError(f"gradient-space KMM solver did not converge: KKT violation {kkt:.3g}")
    return KMMSolution(w=w, objective=objective, status=status, kkt=kkt, form=shell.form, gamma=gamma, budget=budget,
                       method="active_set_gradients", iterations=info["iterations"], time_s=elapsed, info=info)
