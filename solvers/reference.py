"""Reference KMM solver: CVXPY + OSQP on the dense Gram quadratic form, as the paper formulates it."""

from __future__ import annotations

import importlib.metadata
import time

import numpy as np

from convalue.solvers.problem import KMMProblem, KMMSolveError


def _polish_key() -> str:
    major = int(importlib.metadata.version("osqp").split(".")[0])
    return "polishing" if major >= 1 else "polish"  # OSQP 1.0 renamed the setting


#: OSQP settings of the paper's call (CVXPY defaults) and a tight setting used as a test oracle. "polish" is
#: renamed for the installed OSQP when solving, so importing solvers needs no osqp installed.
OSQP_SETTINGS = {
    "paper": {},
    "tight": {"eps_abs": 1e-10, "eps_rel": 1e-10, "max_iter": 200_000, "polish": True},
}


def solve_cvxpy(problem: KMMProblem, *, tolerance: str = "tight") -> tuple[np.ndarray, dict]:
    """Solve `problem` with CVXPY + OSQP; return (w, info) or raise KMMSolveError."""
    try:
        # cvxpy: the optional `reference` extra, only for the paper's oracle
        import cvxpy as cp
    except ImportError as exc:
        raise KMMSolveError("the CVXPY reference needs CVXPY and OSQP, which are not installed: "
                            "pip install 'convalue[reference]'") from exc

    if tolerance not in OSQP_SETTINGS:
        raise ValueError(f"tolerance must be one of {sorted(OSQP_SETTINGS)}, got {tolerance!r}")
    w = cp.Variable(problem.n)
    # "paper": the paper's call verbatim (CVXPY checks K's PSD-ness itself). "tight": K was checked
    # PSD in make_problem, so psd_wrap skips CVXPY's eigen-check, which rejects round-off negatives.
    Kq = problem.K if tolerance == "paper" else cp.psd_wrap(problem.K)
    quad = 0.5 * cp.quad_form(w, Kq) - problem.beta @ w
    l1 = cp.norm1(w) if problem.costs is None else cp.norm1(cp.multiply(problem.costs, w))
    if problem.gamma is not None:
        prob = cp.Problem(cp.Minimize(quad + problem.gamma * l1))
    else:
        prob = cp.Problem(cp.Minimize(quad), [l1 <= problem.budget])
    t0 = time.perf_counter()
    try:
        settings = {(_polish_key() if k == "polish" else k): v for k, v in OSQP_SETTINGS[tolerance].items()}
        prob.solve(solver=cp.OSQP, **settings)
    except cp.error.SolverError as exc:
        raise KMMSolveError(f"CVXPY/OSQP failed: {exc}") from exc
    elapsed = time.perf_counter() - t0
    if prob.status not in (cp.OPTIMAL, cp.OPTIMAL_INACCURATE) or w.value is None:
        raise KMMSolveError(f"CVXPY/OSQP did not solve the KMM problem: status {prob.status!r}")
    iters = None
    stats = prob.solver_stats
    if stats is not None:
        iters = stats.num_iters
    return np.asarray(w.value, dtype=np.float64), {
        "status": prob.status,
        "iterations": iters,
        "time_s": elapsed,
        "method": f"cvxpy-osqp-{tolerance}",
    }
