"""ADMM for dense solutions: K + rho I factored once in float32, the iterate polished by an exact solve on its support."""

from __future__ import annotations

import numpy as np

from convalue.solvers.active_set import kkt_from, nnls_polish, past_deadline, pdas_plain, residual
from convalue.solvers.anderson import Anderson
from convalue.solvers.policy import AdmmPolicy, EarlyStopPolicy, SolverPolicy


def admm_rho(gamma: float, gmax: float, policy: AdmmPolicy) -> float:
    """ADMM's first rho relative to mean K_ii, in proportion to gamma / max|beta| (both ratios scale-free): denser
    solutions (smaller gamma) converge faster with a smaller rho."""
    return float(np.clip(policy.rho_per_ratio * gamma / gmax, policy.rho_min, policy.rho_max))


def stop_level(stop_tol: float | None, gmax: float, policy: EarlyStopPolicy) -> float | None:
    """The absolute KKT violation at which ADMM may return its own iterate (admm_polish's stop_at), or None: no
    stop_tol, or one below the policy's min_tol (float32's floor, which ADMM's iterate stalls above)."""
    return stop_tol * max(1.0, gmax) if stop_tol is not None and stop_tol >= policy.min_tol else None


def early_stop_allowed(n: int, gram: bool, lambda_bound: float, mean_diag: float, policy: EarlyStopPolicy) -> bool:
    """Whether ADMM with a stop_at may go on past the support's settling instead of polishing: a formed K of at
    least min_n candidates whose shifted factor bounds lambda_min(K) above min_lambda mean K_ii (on a nearly
    singular K a small KKT violation says little about the scores)."""
    return gram and n >= policy.min_n and lambda_bound > policy.min_lambda * mean_diag


def support_dear(nonzeros: int, n: int, policy: EarlyStopPolicy) -> bool:
    """Whether factoring a support of this many candidates costs more than ADMM going on to the tolerance: s^3 above
    cube_ratio N^2 (spotrf(s) against about ten more triangular-solve pairs of N)."""
    return float(nonzeros) ** 3 > policy.cube_ratio * n * n


def admm_polish(op, gamma: float, w0: np.ndarray, scale: float, *, policy: SolverPolicy, rho: float = 0.3,
                alpha: float = 1.6, max_iter: int = 2000, deadline: float | None = None,
                stop_at: float | None = None, u0: np.ndarray | None = None) -> tuple[np.ndarray, int, bool, bool]:
    """ADMM on w = z (K + rho I factored once), polished every few iterations by an exact support solve; (w,
    iterations, converged, whether ADMM's own iterate met stop_at).

    The OSQP strategy specialised to a dense PSD K: the ADMM iterate identifies the support and
    signs, and the polish (the support solve on them, then PDAS) makes the answer exact once they are right.
    The polish runs once they have held for the policy's admm.settle iterations, or on a geometric schedule.

    stop_at: a KKT violation at which the iterate itself is returned. Where early_stop_allowed and the support's
    factorisation would cost more than going on (the policy's early_stop.cube_ratio), ADMM goes on with Anderson
    acceleration once the signs hold, checking the KKT conditions in float64 when its fixed-point residual says they
    can hold, and polishes only if it stalls (float32's floor) first.
    u0: a warm start of the scaled dual variable (zero when None), to go with w0: -r / rho' at ADMM's fixed point
    (r = K w0 - beta), clipped to +-gamma / rho', for the absolute rho' = rho mean K_ii.
    """
    n, es, settle = op.n, policy.early_stop, policy.admm.settle
    mean_diag = float(np.mean(op.diag))
    rho = rho * mean_diag
    # where an early stop may come, the factor takes K's float32 cast without keeping a copy (no polish expected)
    early = stop_at is not None and hasattr(op, "K") and n >= es.min_n
    solve = op.shifted_solver(rho, keep_copy=False) if early else op.shifted_solver(rho)
    early = early and early_stop_allowed(n, True, solve.lambda_min_bound, mean_diag, es)
    stopper = _EarlyStop(op, gamma, stop_at, mean_diag, es) if early else None
    z = np.asarray(w0, dtype=np.float64).copy()
    u = np.zeros(n) if u0 is None else np.array(u0, dtype=np.float64)  # scaled dual variable
    feed = z  # the z the next step reads: z itself, or Anderson's extrapolation
    it, next_polish, stable, pattern, polish_now = 0, 25, 0, b"", False
    while it < max_iter and not past_deadline(deadline):
        w = solve(op.beta + rho * (feed - u))
        x = alpha * w + (1 - alpha) * feed + u
        feed_in, u_in = feed, u  # the step's start (each step makes new arrays)
        z_old = z
        u = np.clip(x, -gamma / rho, gamma / rho)  # soft-thresholding x at gamma / rho leaves z = x - u
        z = x - u
        feed = z
        it += 1
        signs = np.sign(z).astype(np.int8).tobytes()
        stable = stable + 1 if signs == pattern else 0
        pattern = signs
        if stopper is not None:
            # past the support's settling, and where the polish would cost more (else it runs as without stop_at)
            if stable >= 2 and support_dear(int(np.count_nonzero(z)), n, es):
                verdict, feed, u = stopper.step(it, feed_in, u_in, z, u, rho)
                if verdict == "met":
                    return z, it, True, True
                if verdict == "going":
                    continue
                stopper, polish_now = None, True  # stalled at float32's floor
            else:
                stopper.restart(it)
        if it % 50 == 0:
            # residual balancing (as OSQP adapts rho): keep primal and dual residuals comparable
            primal = float(np.linalg.norm(w - z))
            dual = rho * float(np.linalg.norm(z - z_old))
            if primal > 10 * dual or dual > 10 * primal:
                factor = 5.0 if primal > dual else 0.2
                rho *= factor
                u /= factor
                solve = op.shifted_solver(rho)
        # polish once the support and signs have held for a few iterations, or on a geometric schedule
        if polish_now or it == next_polish or (stable == settle and it >= 5):
            polish_now = False
            next_polish = max(next_polish, int(it * 1.6) + 5)
            # a support larger than the rank (N > p) is singular: its least-squares solve is slow and cannot be exact
            if np.count_nonzero(z) <= op.rank_bound:
                wp, k, ok = polish_on_support(op, gamma, z, scale)
                if ok:
                    return wp, it + k, True, False
            if it >= 200:  # singular supports (duplicates, N > p): polish by NNLS on the equicorrelation set
                wp, ok = nnls_polish(op, gamma, z, scale, deadline)
                if ok:
                    return wp, it, True, False
    return z, it, False, False


class _EarlyStop:
    """ADMM's stop at a KKT violation (admm_polish's stop_at): Anderson-accelerated steps while the signs hold, a
    float64 check when the fixed-point residual says it can pass, and the stall rule."""

    def __init__(self, op, gamma: float, stop_at: float, mean_diag: float, policy: EarlyStopPolicy):
        self.op, self.gamma, self.stop_at, self.mean_diag, self.policy = op, gamma, stop_at, mean_diag, policy
        memory = policy.anderson_memory
        self.accel = Anderson(2 * op.n, memory) if memory > 0 else None
        self.restart(0)

    def restart(self, it: int) -> None:
        """The signs moved (or the support is cheap to polish): forget the steps' history."""
        if self.accel is not None:
            self.accel.reset()
        self.last_kkt, self.checked, self.since = np.inf, it, it  # since: the start of the stall window

    def step(self, it: int, z_in: np.ndarray, u_in: np.ndarray, z: np.ndarray, u: np.ndarray,
             rho: float) -> tuple[str, np.ndarray, np.ndarray]:
        """("met" | "going" | "stalled", the next z and u to feed ADMM), after ADMM's step from (z_in, u_in) to
        (z, u)."""
        n, every = z.size, self.policy.check_every
        # the fixed-point residual in the KKT's units (K z, rho u) says when a float64 check can pass
        moved = max(self.mean_diag * float(np.abs(z - z_in).max()), rho * float(np.abs(u - u_in).max()))
        if (moved <= self.stop_at and it - self.checked >= 2) or it - self.checked >= every:
            kkt = kkt_from(z, residual(self.op, z), self.gamma)
            if kkt <= self.stop_at:
                return "met", z, u
            self.checked = it
            if it - self.since >= every:  # progress over the last window
                if kkt > self.policy.stall * self.last_kkt:
                    return "stalled", z, u
                self.last_kkt, self.since = kkt, it
        if self.accel is None:
            return "going", z, u
        v = self.accel.push(np.concatenate([z_in, u_in]), np.concatenate([z, u]))
        return "going", v[:n], v[n:]


def polish_on_support(op, gamma: float, z: np.ndarray, scale: float) -> tuple[np.ndarray, int, bool]:
    """The exact solution on z's support and signs, then up to two PDAS steps from it; (w, steps, converged).

    The support solve comes first because z is only approximate: the PDAS rule applied to z itself can pick
    another support even when z's signs are already those of the optimum.
    """
    A = np.flatnonzero(z)
    w = np.zeros_like(z)
    r = None
    if A.size:
        w[A], r = op.solve_support_residual(A, op.beta[A] - gamma * np.sign(z[A]))
    wp, k, ok = pdas_plain(op, gamma, w, 2, scale, r=r)  # returns w itself, after 0 steps, when it is optimal
    return wp, 1 + k, ok
