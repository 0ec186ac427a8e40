"""The budget form (paper eq. kmm_qp): argmin 0.5 w'Kw - beta'w s.t. ||w||_1 <= k, read off the penalised path."""

from __future__ import annotations

import numpy as np

from convalue.solvers import plan
from convalue.solvers.active_set import kkt_from, residual
from convalue.solvers.homotopy import budget_on_path, lars
from convalue.solvers.penalised import prefers_gram_form, solve_penalised
from convalue.solvers.plan import BudgetFacts, plan_budget
from convalue.solvers.policy import DEFAULT_POLICY, SolverPolicy
from convalue.solvers.working_set import working_set_budget


def _budget_on_homotopy(op, budget: float, gmax: float, scale: float) -> tuple[np.ndarray, dict] | None:
    """The budget's solution between two breakpoints of the homotopy (w and ||w||_1 are affine there), or
    None when the interpolated point does not certify."""
    gammas, W, steps = lars(op, gmax * 1e-12, return_path=True)
    found = budget_on_path(gammas, W, budget)
    binding = found is not None
    # where the budget never binds: the (min-l1) unconstrained optimum, if the path got there
    g, w = found if binding else (0.0, W[-1])
    if kkt_from(w, residual(op, w), g) > scale:
        return None
    return w, {"iterations": steps, "gamma": g, "binding": binding, "converged": True, "strategy": "homotopy"}


def solve_budget(op, budget: float, *, max_iter: int = 100,
                 policy: SolverPolicy = DEFAULT_POLICY) -> tuple[np.ndarray, dict]:
    """argmin 0.5 w'Kw - beta'w s.t. ||w||_1 <= budget, through the penalised path; the plan's steps
    (convalue.solvers.plan.plan_budget) in order.

    ||w(gamma)||_1 is non-increasing in gamma and, where the support and signs are constant, w(gamma) is affine:
    read the budget off the homotopy's breakpoints (all candidates, or a working set), else bracket it on a gamma
    grid; then interpolate exactly. In the gradient form with N <= p, K is formed once when the grid first reaches a
    dense gamma (info "gram_formed"), as convalue.solvers.api does for the penalised form.
    """
    gmax = float(np.abs(op.beta).max())
    scale = 1e-10 * max(1.0, gmax)
    b = policy.budget
    steps = plan_budget(BudgetFacts(n=op.n, rank=int(op.rank_bound)), policy)
    for step in steps:
        found = None
        if step == plan.HOMOTOPY:
            found = _budget_on_homotopy(op, budget, gmax, scale)
        elif step == plan.WORKING_SET:
            w, g, k, ok = working_set_budget(op, budget, scale, policy=policy, max_size=b.working_set_max,
                                             max_active=b.working_set_active)
            if ok:
                found = w, {"iterations": k, "gamma": g, "binding": True, "converged": True,
                            "strategy": "working_set_homotopy"}
        else:
            found = _gamma_grid(op, budget, gmax, scale, max_iter, policy)
        if found is not None:
            return found[0], found[1] | {"plan": steps}
    raise AssertionError("the gamma grid always answers")  # plan_budget ends with it


def _gamma_grid(op, budget: float, gmax: float, scale: float, max_iter: int,
                policy: SolverPolicy) -> tuple[np.ndarray, dict]:
    """The budget bracketed on a gamma grid of warm-started penalised solves, then interpolated exactly."""
    grid = {"strategy": "gamma_grid"}

    def answer(w: np.ndarray, iters: int, g: float, binding: bool = True) -> tuple[np.ndarray, dict]:
        return w, {"iterations": iters, "gamma": g, "binding": binding, "converged": True} | grid

    def penalised(g: float, w0: np.ndarray) -> tuple[np.ndarray, dict]:
        nonlocal op
        if prefers_gram_form(op, g, policy):
            op = op.gram()
            grid["gram_formed"] = True
        return solve_penalised(op, g, w0=w0, max_iter=max_iter, policy=policy)

    hi_g, hi_w = gmax, np.zeros(op.n)
    g, w, iters = gmax, np.zeros(op.n), 0
    lo = None
    floor = gmax * 1e-12
    while g > floor:
        g = max(g * 0.25, floor)
        w, info = penalised(g, w)
        iters += info["iterations"]
        if np.abs(w).sum() >= budget:
            lo = (g, w)
            break
        hi_g, hi_w = g, w
    if lo is None:  # the budget never binds: the (min-l1) unconstrained optimum
        return answer(w, iters, 0.0, binding=False)
    lo_g, lo_w = lo

    def pattern(x: np.ndarray) -> bytes:
        A = np.flatnonzero(x)
        return A.tobytes() + np.sign(x[A]).tobytes()

    for it in range(200):
        l_hi, l_lo = np.abs(hi_w).sum(), np.abs(lo_w).sum()
        t = (budget - l_hi) / (l_lo - l_hi) if l_lo > l_hi else 1.0
        if pattern(hi_w) == pattern(lo_w):
            w = hi_w + t * (lo_w - hi_w)
            return answer(w, iters, hi_g + t * (lo_g - hi_g))
        g_mid = None
        A = np.flatnonzero(hi_w)
        if A.size:
            # with hi's support and signs fixed, w_A(gamma) = K_AA^-1 (beta_A - gamma s) is affine and
            # ||w||_1 = s'x - gamma s'y: the exact gamma where that support reaches the budget
            sA = np.sign(hi_w[A])
            x, y = op.solve_support(A, np.column_stack([op.beta[A], sA])).T
            if float(sA @ y) > 0:
                g_c = (float(sA @ x) - budget) / float(sA @ y)
                if lo_g < g_c < hi_g:
                    w_c = np.zeros(op.n)
                    w_c[A] = x - g_c * y
                    if np.all(np.sign(w_c[A]) == sA) and kkt_from(w_c, residual(op, w_c), g_c) <= scale:
                        return answer(w_c, iters + it, g_c)
                    g_mid = g_c
        if g_mid is None or it % 2:  # alternate with bisection so neither end stagnates
            g_mid = 0.5 * (hi_g + lo_g)
        w_mid, info = penalised(g_mid, lo_w)
        iters += info["iterations"]
        l_mid = np.abs(w_mid).sum()
        if abs(l_mid - budget) <= 1e-13 * max(1.0, budget):
            return answer(w_mid, iters, g_mid)
        if l_mid < budget:
            hi_g, hi_w = g_mid, w_mid
        else:
            lo_g, lo_w = g_mid, w_mid
        if hi_g - lo_g <= 1e-14 * gmax:
            break
    # the bracket collapsed onto a breakpoint: interpolate between its two sides
    l_hi, l_lo = np.abs(hi_w).sum(), np.abs(lo_w).sum()
    t = (budget - l_hi) / (l_lo - l_hi) if l_lo > l_hi else 1.0
    w = hi_w + t * (lo_w - hi_w)
    return answer(w, iters, hi_g + t * (lo_g - hi_g))
