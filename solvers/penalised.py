"""The penalised form (paper eq. kmm_l1_penalized): the plan's steps (convalue.solvers.plan), run until one certifies.

For a support A with signs s the optimum solves K_AA w_A = beta_A - gamma s_A. The steps: PDAS and its safeguards
(convalue.solvers.active_set), ADMM + polish (convalue.solvers.admm), the LARS homotopy on all candidates
(convalue.solvers.homotopy) or on a working set grown by KKT violators (convalue.solvers.working_set); the fallbacks
start from the closest iterate any step reached: an NNLS polish, the CVXPY reference, coordinate descent.
"""

from __future__ import annotations

import importlib.util
import time

import numpy as np

from convalue.solvers import active_set, admm, plan, reduced, working_set
from convalue.solvers.active_set import kkt_from, past_deadline, residual
from convalue.solvers.homotopy import distinct, expand, lars
from convalue.solvers.plan import PenalisedFacts, forms_gram, plan_penalised, seed_fills_wide
from convalue.solvers.policy import DEFAULT_POLICY, SolverPolicy
from convalue.solvers.problem import KMMProblem
from convalue.solvers.reference import solve_cvxpy

#: the strategy each step reports in info["strategy"] (and, for the fallbacks, info["fallback"])
REPORTED = {plan.HOMOTOPY: "homotopy", plan.WORKING_SET: "working_set_homotopy", plan.PROBE: "working_set_homotopy",
            plan.WARM_PDAS: "warm_pdas", plan.PDAS_DIRECT: "pdas_direct", plan.PDAS_CONTINUATION: "pdas_continuation",
            plan.ADMM_FIRST: "admm_polish", plan.SEEDED_WIDE: "working_set_homotopy",
            plan.WIDE: "working_set_homotopy", plan.FALLBACK_HOMOTOPY_IF_SEED_FULL: "homotopy",
            plan.FALLBACK_HOMOTOPY_UNLESS_SEED_FULL: "homotopy", plan.FALLBACK_HOMOTOPY: "homotopy",
            plan.ADMM: "admm_polish", plan.REDUCED: "reduced_working_set", plan.NNLS_POLISH: "nnls_polish",
            plan.CVXPY_REFERENCE: "cvxpy_reference", plan.COORDINATE_DESCENT: "coordinate_descent+nnls_polish"}


def facts_of(op, gamma: float, warm_start: bool = False) -> PenalisedFacts:
    """The plan's facts of an operator at gamma."""
    return PenalisedFacts(n=op.n, rank=int(op.rank_bound), gram=hasattr(op, "K"), gamma=float(gamma),
                          beta_max=float(np.abs(op.beta).max()), warm_start=warm_start)


def prefers_gram_form(op, gamma: float, policy: SolverPolicy) -> bool:
    """True for a gradient-form operator that is faster solved on K = G G^T formed once (convalue.solvers.plan)."""
    return forms_gram(facts_of(op, gamma), policy)


def _homotopy(op, gamma: float, scale: float, policy: SolverPolicy) -> tuple[np.ndarray, int, bool]:
    """The homotopy's solution at gamma, certified by its KKT (two PDAS steps if round-off left it short).

    In the gradient form scikit-learn's LARS runs on X = G^T, which can end off the path; there, up to the policy's
    homotopy.gram_max_n, LARS runs again on K formed once.
    """
    _, W, steps = lars(op, gamma, return_path=False)
    wp, k, ok = active_set.pdas_plain(op, gamma, W[-1], 2, scale)  # w itself, after 0 steps, when it certifies
    if not ok and not hasattr(op, "K") and op.n <= policy.homotopy.gram_max_n:
        _, W, more = lars(op.gram(), gamma, return_path=False)
        wp, k2, ok = active_set.pdas_plain(op, gamma, W[-1], 2, scale)
        steps, k = steps + more, k + k2
    return wp, steps + k, ok


def _distinct_homotopy(op, gamma: float, scale: float, policy: SolverPolicy) -> tuple[np.ndarray, int, bool]:
    """_homotopy on one candidate of every duplicate group (the entry points deduplicate only affordable problems),
    put back on all candidates."""
    sub, keep = distinct(op, policy.homotopy.max_pairs)
    w, k, ok = _homotopy(sub, gamma, scale, policy)
    return expand(w, keep, op.n), k, ok


class _Steps:
    """The plan's steps on one problem; ADMM's first steps leave their iterate for the steps after them."""

    def __init__(self, op, gamma: float, policy: SolverPolicy, scale: float, deadline: float | None,
                 stop_at: float | None, w0: np.ndarray | None, factor: float, max_iter: int):
        self.op, self.gamma, self.policy, self.scale, self.deadline = op, gamma, policy, scale, deadline
        self.stop_at, self.w0, self.factor, self.max_iter = stop_at, w0, factor, max_iter
        self.first_iterate: np.ndarray | None = None  # where ADMM's first steps did not finish, their iterate
        self.early_stopped = False  # whether ADMM's own iterate answered (at stop_at)

    def run(self, step: str) -> tuple[np.ndarray, int, bool] | None:
        """(w, iterations, certified), or None where the step declines after what the steps before it found."""
        op, gamma, scale, deadline, p = self.op, self.gamma, self.scale, self.deadline, self.policy.plan
        if step == plan.HOMOTOPY:
            return _homotopy(op, gamma, scale, self.policy)
        if step == plan.WORKING_SET:
            return working_set.working_set_homotopy(op, gamma, scale, deadline, policy=self.policy)
        if step == plan.PROBE:
            return working_set.working_set_homotopy(op, gamma, scale, deadline, policy=self.policy,
                                                    start=p.probe_start, max_size=p.probe_max)
        if step == plan.WARM_PDAS:
            return active_set.pdas(op, gamma, self.w0, self.max_iter, deadline=deadline)
        if step == plan.PDAS_DIRECT:
            return active_set.pdas_plain(op, gamma, np.zeros(op.n), 15, scale, deadline)
        if step == plan.PDAS_CONTINUATION:
            return active_set.continuation(op, gamma, self.factor, self.max_iter, deadline)
        if step == plan.REDUCED:
            return reduced.reduced_working_set(op.G, op.beta, op.diag, gamma, scale, deadline, policy=self.policy)
        if step in (plan.ADMM_FIRST, plan.ADMM):
            return self._admm(p.admm_first_steps if step == plan.ADMM_FIRST else 0)
        if step in (plan.SEEDED_WIDE, plan.WIDE):
            seed = self.first_iterate if step == plan.SEEDED_WIDE else None
            return working_set.working_set_homotopy(op, gamma, scale, deadline, policy=self.policy,
                                                    max_size=p.wide_max, seed=seed)
        if step == plan.FALLBACK_HOMOTOPY:
            return _distinct_homotopy(op, gamma, scale, self.policy)
        if step in (plan.FALLBACK_HOMOTOPY_IF_SEED_FULL, plan.FALLBACK_HOMOTOPY_UNLESS_SEED_FULL):
            full = (self.first_iterate is not None
                    and seed_fills_wide(int(np.count_nonzero(self.first_iterate)), self.policy))
            if full != (step == plan.FALLBACK_HOMOTOPY_IF_SEED_FULL):
                return None
            return _distinct_homotopy(op, gamma, scale, self.policy)
        raise ValueError(f"unknown step {step!r}")

    def _admm(self, first: int) -> tuple[np.ndarray, int, bool]:
        """ADMM + polish at the first rho, then the policy's retries (first > 0: the first rho for that many steps)."""
        op, gamma, a = self.op, self.gamma, self.policy.admm
        rho0 = admm.admm_rho(gamma, float(np.abs(op.beta).max()), a)
        total, best = 0, np.zeros(op.n)
        for rho in (rho0,) if first else (rho0, *a.rho_retries):
            if past_deadline(self.deadline):
                break
            w, it, ok, stopped = admm.admm_polish(op, gamma, np.zeros(op.n), self.scale, policy=self.policy, rho=rho,
                                                   max_iter=first or a.max_iter, deadline=self.deadline,
                                                   stop_at=self.stop_at)
            total += it
            if ok:
                self.early_stopped = stopped
                return w, total, True
            if first:
                self.first_iterate = w
            best = _closer(op, gamma, best, w)  # an unfinished run's iterate, not a later run's zero start
        return best, total, False


def solve_penalised(op, gamma: float, *, w0: np.ndarray | None = None, factor: float = 0.25, max_iter: int = 200,
                    tol: float = 1e-10, stop_tol: float | None = None, max_seconds: float | None = None,
                    policy: SolverPolicy = DEFAULT_POLICY) -> tuple[np.ndarray, dict]:
    """argmin 0.5 w'Kw - beta'w + gamma ||w||_1 through the operator; (w, info), info["plan"] the steps planned.

    tol: the KKT violation, relative to max(1, max|beta|), at which an answer is certified. stop_tol: ADMM may return
    its own iterate once its KKT violation (relative likewise) is at most this, where the policy's early_stop allows
    (convalue.solvers.admm); every other answer is certified at tol. w0: a warm start; factor and max_iter: PDAS's
    continuation ratio and its steps; max_seconds: a deadline for the whole solve.
    """
    facts = facts_of(op, gamma, warm_start=w0 is not None)
    steps = plan_penalised(facts, policy)
    if steps == (plan.ZERO,):
        return np.zeros(op.n), {"iterations": 0, "strategy": "zero", "converged": True, "fallback": None,
                                "plan": steps, "step": plan.ZERO}
    gmax = facts.beta_max
    scale = tol * max(1.0, gmax)
    deadline = None if max_seconds is None else time.perf_counter() + max_seconds
    runner = _Steps(op, gamma, policy, scale, deadline, admm.stop_level(stop_tol, gmax, policy.early_stop), w0,
                    factor, max_iter)
    iters, best, ok, strategy, w = 0, None, False, None, None
    for step in steps:
        if step in plan.FALLBACKS:
            break
        out = runner.run(step)
        if out is None:
            continue
        strategy = step
        w, it, ok = out
        iters += it
        if ok:
            break
        best = w if best is None else _closer(op, gamma, best, w)  # the fallbacks start from the closest iterate
    if not ok:
        w = best
    fallback = None
    for step in steps[steps.index(plan.NNLS_POLISH):] if not ok else ():
        if ok or (step != plan.NNLS_POLISH and past_deadline(deadline)):
            break
        w, ok, sweeps = _fallback(step, op, gamma, w, scale, deadline)
        iters += sweeps
        fallback = REPORTED[step]
    info = {"iterations": iters, "strategy": REPORTED[strategy], "converged": ok, "fallback": fallback,
            "plan": steps, "step": strategy}
    return w, info | ({"early_stop": True} if runner.early_stopped else {})  # set only by the step that answered


def _fallback(step: str, op, gamma: float, w: np.ndarray, scale: float,
              deadline: float | None) -> tuple[np.ndarray, bool, int]:
    """(w, certified, sweeps) of one fallback from the closest iterate w."""
    if step == plan.NNLS_POLISH:
        w, ok = active_set.nnls_polish(op, gamma, w, scale, deadline)
        return w, ok, 0
    if step == plan.CVXPY_REFERENCE:  # a degenerate problem the active-set paths could not certify

        if importlib.util.find_spec("cvxpy") is None:  # the `reference` extra is not installed: the next fallback
            return w, False, 0

        K = op.K if hasattr(op, "K") else op.sub(np.arange(op.n))
        w_ref, _ = solve_cvxpy(KMMProblem(K=K, beta=op.beta, gamma=gamma), tolerance="tight")
        w_ref = np.where(np.abs(w_ref) > 1e-12 * max(1.0, float(np.abs(w_ref).max())), w_ref, 0.0)
        w_ref, polished = active_set.nnls_polish(op, gamma, w_ref, scale)
        ok = polished or kkt_from(w_ref, residual(op, w_ref), gamma) <= 1e3 * scale
        return (w_ref if ok else _closer(op, gamma, w, w_ref)), ok, 0
    w_cd, sweeps = active_set.coordinate_descent(op, gamma, w, max_sweeps=5000, tol=1e-9, deadline=deadline)
    w_cd, ok = active_set.nnls_polish(op, gamma, w_cd, scale, deadline)
    return (w_cd if ok else _closer(op, gamma, w, w_cd)), ok, sweeps


def _closer(op, gamma: float, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Whichever of two uncertified iterates has the smaller KKT violation (a on a tie)."""
    return b if kkt_from(b, residual(op, b), gamma) < kkt_from(a, residual(op, a), gamma) else a
