"""ADMM for dense solutions: K + rho I factored once in float32, the iterate polished by an exact solve on its support."""

from __future__ import annotations

import numpy as np

from convalue.solvers.active_set import kkt_from, nnls_polish, past_deadline, pdas_plain, residual
from convalue.solvers.anderson import Anderson

#: with a stopping KKT (admm_polish's stop_at), ADMM goes on past the support's settling, Anderson-accelerated,
#: instead of polishing, where the polish's factorisation would cost more: on a Gram operator whose support s has
#: s^3 > EARLY_STOP_CUBE_RATIO * N^2 (spotrf(s) against about ten triangular-solve pairs of N; tuned on clustered
#: N = 500-2000 against the polish: 1.2-1.7x above it, 0.99-1.04x near it) ...
EARLY_STOP_CUBE_RATIO = 150.0
#: ... and N at least this, below which each step's Python overhead (about 50 us) outweighs the polish it saves
#: (bench/early_stop.py, clustered, three gammas: N = 300 0.80-0.94x, 400 1.10-1.28x, 700 1.19-1.76x)
EARLY_STOP_MIN_N = 400
#: each check costs a float64 product K z, so it runs where the fixed-point residual, in the KKT's units, is below
#: the tolerance, and at least every this many steps
EARLY_STOP_CHECK_EVERY = 8
#: ADMM gives up (polishes) where the KKT violation fell by less than this factor over that many steps (float32's
#: floor; Anderson's steps on clustered data cut it by 1e2-1e3 there)
EARLY_STOP_STALL = 0.1
#: nor where the shifted factor's pivots show K nearly singular: lambda_min(K) <= this times mean K_ii (the bound is
#: the smallest pivot minus rho). There a KKT violation of 1e-6 says little about the scores: near-parallel
#: gradients at 1500 x 4096 (lambda_min 6e-5, the bound 4.7e-4) stopped at KKT 6.1e-7 with 1500 nonzero scores where
#: the exact answer has 1209, and its top 3 shared none with the exact top 3; clustered data bound 0.088-0.106
EARLY_STOP_MIN_LAMBDA = 0.01
#: the early stop's Anderson memory (0: plain ADMM steps; read at call time). bench/early_stop.py --versus plain
ANDERSON_MEMORY = 5
#: no early stop below this relative tolerance: ADMM's float32 iterate stalls above it (its floor: KKT 1.4e-7 and
#: 2.2e-7 at N = 1000, gamma = 1e-4 and 5e-4), and the stall cost 1.3-1.8x the exact solve before the polish
EARLY_STOP_MIN_TOL = 3e-7


def admm_rho(gamma: float, gmax: float) -> float:
    """ADMM's first rho relative to mean K_ii, in proportion to gamma / max|beta| (both ratios scale-free).

    Denser solutions (smaller gamma) converge faster with a smaller rho. bench/admm_rho.py against the former
    fixed rho = 0.3 (36 clustered cases, N = 300-2000, gamma / max|beta| from 3e-4 to 8e-3): fewer solver
    iterations in 29, the same in 3, more in 4; 1.32x faster (geometric mean); 22 -> 11 at N = 1000, gamma = 5e-4.
    """
    return float(np.clip(125.0 * gamma / gmax, 0.01, 1.0))


def admm_polish(op, gamma: float, w0: np.ndarray, scale: float, *, rho: float = 0.3, alpha: float = 1.6,
                max_iter: int = 2000, settle: int = 3, deadline: float | None = None,
                stop_at: float | None = None) -> tuple[np.ndarray, int, bool, bool]:
    """ADMM on w = z (K + rho I factored once), polished every few iterations by an exact support solve; (w,
    iterations, converged, whether ADMM's own iterate met stop_at).

    The OSQP strategy specialised to a dense PSD K: the ADMM iterate identifies the support and
    signs, and the polish (the support solve on them, then PDAS) makes the answer exact once they are right.
    The polish runs once they have held for `settle` iterations (bench/admm_rho.py: 3 beats 1 and 2, whose
    failed early polishes cost a factorisation each), or on a geometric schedule.

    stop_at: a KKT violation at which the iterate itself is returned. Where the support's factorisation would cost
    more (EARLY_STOP_CUBE_RATIO, EARLY_STOP_MIN_N; the Gram form only) and K is not nearly singular
    (EARLY_STOP_MIN_LAMBDA), ADMM then goes on with Anderson
    acceleration once the signs hold, checking the KKT conditions in float64 when its fixed-point residual says they
    can hold, and polishes only if it stalls (float32's floor) first.
    """
    n = op.n
    mean_diag = float(np.mean(op.diag))
    rho = rho * mean_diag
    early = stop_at is not None and hasattr(op, "K") and n >= EARLY_STOP_MIN_N
    solve = op.shifted_solver(rho, keep_copy=False) if early else op.shifted_solver(rho)
    early = early and solve.lambda_min_bound > EARLY_STOP_MIN_LAMBDA * mean_diag
    stopper = _EarlyStop(op, gamma, stop_at, mean_diag) if early else None
    z = np.asarray(w0, dtype=np.float64).copy()
    u = np.zeros(n)  # scaled dual variable
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
            if stable >= 2 and float(np.count_nonzero(z)) ** 3 > EARLY_STOP_CUBE_RATIO * n * n:
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
            # a support larger than the rank (N > p) is singular: its least-squares solve cost 1.1 s a time at
            # N = 3000 > p = 1000 (near-parallel gradients, 2000 in the support) and cannot be exact
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

    def __init__(self, op, gamma: float, stop_at: float, mean_diag: float):
        self.op, self.gamma, self.stop_at, self.mean_diag = op, gamma, stop_at, mean_diag
        self.accel = Anderson(2 * op.n, ANDERSON_MEMORY) if ANDERSON_MEMORY > 0 else None
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
        n = z.size
        # the fixed-point residual in the KKT's units (K z, rho u) says when a float64 check can pass
        moved = max(self.mean_diag * float(np.abs(z - z_in).max()), rho * float(np.abs(u - u_in).max()))
        if (moved <= self.stop_at and it - self.checked >= 2) or it - self.checked >= EARLY_STOP_CHECK_EVERY:
            kkt = kkt_from(z, residual(self.op, z), self.gamma)
            if kkt <= self.stop_at:
                return "met", z, u
            self.checked = it
            if it - self.since >= EARLY_STOP_CHECK_EVERY:  # progress over the last window
                if kkt > EARLY_STOP_STALL * self.last_kkt:
                    return "stalled", z, u
                self.last_kkt, self.since = kkt, it
        if self.accel is None:
            return "going", z, u
        v = self.accel.push(np.concatenate([z_in, u_in]), np.concatenate([z, u]))
        return "going", v[:n], v[n:]


def polish_on_support(op, gamma: float, z: np.ndarray, scale: float) -> tuple[np.ndarray, int, bool]:
    """The exact solution on z's support and signs, then up to two PDAS steps from it; (w, steps, converged).

    The support solve comes first because z is only approximate: the PDAS rule applied to z itself can pick
    another support even when z's signs are already those of the optimum (instrumented at N = 1000,
    gamma = 5e-4 with rho from admm_rho: two or three failed factorisations where one support solve is
    exact). bench/admm_rho.py at the fixed rho = 0.3: 1.08x faster than the PDAS rule alone (geometric mean).
    """
    A = np.flatnonzero(z)
    w = np.zeros_like(z)
    r = None
    if A.size:
        w[A], r = op.solve_support_residual(A, op.beta[A] - gamma * np.sign(z[A]))
    wp, k, ok = pdas_plain(op, gamma, w, 2, scale, r=r)  # returns w itself, after 0 steps, when it is optimal
    return wp, 1 + k, ok
