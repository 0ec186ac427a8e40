"""Active-set methods for the penalised KMM problem at one gamma (paper eq. kmm_l1_penalized), and the helpers every
strategy shares.

For a support A with signs s the penalised optimum solves K_AA w_A = beta_A - gamma s_A. Primal-dual active set
(PDAS: A and s from the fixed point w_i = soft(w_i + d_i / K_ii, gamma / K_ii), d = beta - K w) jumps to that
system's solution; orthant-projected Newton is its monotone safeguard; gamma continuation warm-starts it down
from max|beta|. The NNLS polish handles singular supports (duplicated candidates); coordinate descent is the
slow, always-convergent fallback. The order in which solve_penalised tries them is in convalue.solvers.penalised.
"""

from __future__ import annotations

import time

import numpy as np

from convalue.solvers.problem import objective_from_residual


def past_deadline(deadline: float | None) -> bool:
    """True once a deadline (a perf_counter time, or None for none) has passed."""
    return deadline is not None and time.perf_counter() > deadline


def residual(op, w: np.ndarray) -> np.ndarray:
    """r = K w - beta, reading only w's support through the operator."""
    support = np.flatnonzero(w)
    return op.apply(support, w[support]) - op.beta


def objective_at(w: np.ndarray, r: np.ndarray, beta: np.ndarray, gamma: float) -> float:
    """The penalised objective at w from its residual r = K w - beta (no product)."""
    return objective_from_residual(w, r, beta, gamma * float(np.abs(w).sum()))


def kkt_from(w: np.ndarray, r: np.ndarray, gamma: float) -> float:
    """Largest KKT violation of the penalised problem at w, given r = K w - beta."""
    on = w != 0
    v1 = np.abs(r[on] + gamma * np.sign(w[on])).max(initial=0.0)
    v2 = (np.abs(r[~on]) - gamma).max(initial=0.0)
    return float(max(v1, v2, 0.0))


def pdas_plain(op, gamma: float, w: np.ndarray, max_iter: int, scale: float,
               deadline: float | None = None, r: np.ndarray | None = None,
               diverging: int | None = 2) -> tuple[np.ndarray, int, bool]:
    """Plain PDAS (full Newton jumps); stops at a KKT point, on a cycle, on divergence, or at max_iter; returns
    the best iterate.

    r, when given, is the residual K w - beta at w (saves a product). diverging: stop after this many objective
    increases in a row (None: never). PDAS is not monotone, but where it fails straight at a small gamma its
    objective climbs at every step while its supports grow toward N, each a larger factorisation.
    """
    beta = op.beta
    diag = np.maximum(op.diag, 1e-300)
    if r is None:
        r = residual(op, w)
    f = objective_at(w, r, beta, gamma)
    best_w, best_f = w, f
    seen: set[bytes] = set()
    rises = 0
    for it in range(1, max_iter + 1):
        if kkt_from(w, r, gamma) <= scale:
            return w, it - 1, True
        if diverging is not None and rises >= diverging:
            break
        u = diag * w - r
        A = np.flatnonzero(np.abs(u) > gamma)
        s = np.sign(u[A])
        key = A.tobytes() + s.tobytes()
        if key in seen or past_deadline(deadline) or A.size > getattr(op, "rank_bound", op.n):
            break  # a cycle, out of time, or a support too large to be nonsingular (N > p)
        seen.add(key)
        w = np.zeros_like(w)
        if A.size:
            w[A], r = op.solve_support_residual(A, beta[A] - gamma * s)
        else:
            r = -beta
        f, f_before = objective_at(w, r, beta, gamma), f
        rises = rises + 1 if f > f_before else 0
        if f < best_f:
            best_w, best_f = w, f
    converged = kkt_from(w, r, gamma) <= scale
    return (w if converged else best_w), len(seen), converged  # one support solve per pattern seen


def orthant_newton(op, gamma: float, w: np.ndarray, max_iter: int, scale: float,
                   deadline: float | None = None) -> tuple[np.ndarray, int, bool]:
    """Orthant-projected Newton with Armijo backtracking (monotone; many coordinates may leave per step).

    The orthant xi keeps the signs of the support and opens zero coordinates whose pseudo-gradient
    allows descent; the Newton point solves the support system on xi's support; the trial points
    P_xi(w + t (z - w)) clamp coordinates that would change sign to zero.
    """
    beta = op.beta
    r = residual(op, w)
    f = objective_at(w, r, beta, gamma)
    lipschitz = float(np.maximum(op.diag, 0).sum())
    for it in range(1, max_iter + 1):
        if kkt_from(w, r, gamma) <= scale:
            return w, it - 1, True
        if past_deadline(deadline):
            return w, it, False
        pg = np.where(w > 0, r + gamma, np.where(w < 0, r - gamma,
                      np.where(r + gamma < 0, r + gamma, np.where(r - gamma > 0, r - gamma, 0.0))))
        xi = np.where(w != 0, np.sign(w), -np.sign(pg))
        W = np.flatnonzero(xi)
        z = np.zeros_like(w)
        z[W] = op.solve_support(W, beta[W] - gamma * xi[W])
        t, accepted = 1.0, False
        for _ in range(30):
            trial = w + t * (z - w)
            trial[np.sign(trial) != xi] = 0.0
            moved = np.flatnonzero(trial != w)
            if moved.size == 0:
                break
            r_trial = r + op.apply(moved, (trial - w)[moved])
            f_trial = objective_at(trial, r_trial, beta, gamma)
            if f_trial <= f + 1e-4 * float(pg @ (trial - w)):
                accepted = True
                break
            t *= 0.5
        if not accepted:  # no descent along the Newton arc: one proximal-gradient step
            x = w - r / lipschitz
            trial = np.sign(x) * np.maximum(np.abs(x) - gamma / lipschitz, 0.0)
            moved = np.flatnonzero(trial != w)
            if moved.size == 0:
                return w, it, kkt_from(w, r, gamma) <= scale
            r_trial = r + op.apply(moved, (trial - w)[moved])
            f_trial = objective_at(trial, r_trial, beta, gamma)
        w, r, f = trial, r_trial, f_trial
        if it % 20 == 0:  # refresh r against drift from the incremental updates
            r = residual(op, w)
    return w, max_iter, kkt_from(w, r, gamma) <= scale


def pdas(op, gamma: float, w: np.ndarray, max_iter: int = 200, tol: float = 1e-10,
         deadline: float | None = None) -> tuple[np.ndarray, int, bool]:
    """Active-set solve at one gamma from a warm start w; (w, iterations, converged).

    Phase 1, plain PDAS: jump to the Newton point of the support chosen by the fixed-point rule
    (superlinear near the solution, but it may cycle). Phase 2, from phase 1's best iterate if
    it stalled: orthant-projected Newton with Armijo backtracking, which cannot cycle.
    """
    w = np.asarray(w, dtype=np.float64).copy()
    scale = tol * max(1.0, float(np.abs(op.beta).max()))
    w, n_plain, ok = pdas_plain(op, gamma, w, min(max_iter, 15), scale, deadline)
    if ok:
        return w, n_plain, True
    w, n_newton, ok = orthant_newton(op, gamma, w, max_iter, scale, deadline)
    return w, n_plain + n_newton, ok


def coordinate_descent(op, gamma: float, w: np.ndarray, *, max_sweeps: int = 10_000,
                       tol: float = 1e-12, deadline: float | None = None) -> tuple[np.ndarray, int]:
    """Cyclic coordinate descent (the slow, always-convergent fallback); needs op.K or forms columns."""
    w = np.asarray(w, dtype=np.float64).copy()
    r = residual(op, w)
    diag = op.diag
    for sweep in range(1, max_sweeps + 1):
        if past_deadline(deadline):
            return w, max_sweeps
        biggest = 0.0
        for i in range(op.n):
            if diag[i] <= 0:
                continue
            z = w[i] - r[i] / diag[i]
            new = np.sign(z) * max(abs(z) - gamma / diag[i], 0.0)
            delta = new - w[i]
            if delta != 0.0:
                r += delta * op.apply(np.array([i]), np.array([1.0]))
                w[i] = new
                biggest = max(biggest, abs(delta))
        if biggest <= tol * max(1.0, float(np.abs(w).max())):
            return w, sweep
    return w, max_sweeps


def kkt_of(op, gamma: float, w: np.ndarray) -> float:
    """Largest KKT violation of the penalised problem at w (computed through the operator)."""
    return kkt_from(w, residual(op, w), gamma)


def continuation(op, gamma: float, factor: float, max_iter: int,
                 deadline: float | None = None) -> tuple[np.ndarray, int, bool]:
    """PDAS at gamma_max * factor^k down to gamma, each stage warm-started from the last; (w, iterations, converged)."""
    gmax = float(np.abs(op.beta).max())
    n_stages = max(1, int(np.ceil(np.log(gamma / gmax) / np.log(factor))))
    stages = [g for g in gmax * factor ** np.arange(1, n_stages) if g > gamma] + [gamma]
    w, total, ok = np.zeros(op.n), 0, False
    for g in stages:
        w_try, it, ok = pdas(op, g, w, max_iter, deadline=deadline)
        total += it
        if ok or g == gamma:
            w = w_try
    return w, total, ok


def nnls_polish(op, gamma: float, w: np.ndarray, scale: float,
                deadline: float | None = None) -> tuple[np.ndarray, bool]:
    """Exact solution on the (slightly enlarged) equicorrelation set of a near-optimal w, sign-consistent.

    With E = {i : |d_i| ~ gamma}, s = sign(d_E), the optimum solves K_EE w_E = beta_E - gamma s_E with
    s_i w_i >= 0: a non-negative least-squares problem in v = s * w_E (Lawson-Hanson: exact and
    fine with singular K_EE, where the support system is underdetermined).
    """
    # scipy.optimize (1.0 s to import): only for an NNLS polish
    from scipy.optimize import nnls

    d = -residual(op, w)
    for rel in (1e-7, 1e-5, 1e-3, 1e-2, 3e-2):
        if past_deadline(deadline):  # each NNLS on a large E can take seconds
            break
        E = np.flatnonzero(np.abs(d) >= gamma * (1 - rel))
        if E.size == 0 or E.size > 3000:
            continue
        sE = np.sign(d[E])
        M = op.sub(E) * sE[None, :]
        v, _ = nnls(M, op.beta[E] - gamma * sE, maxiter=50 * E.size)
        cand = np.zeros_like(w)
        cand[E] = sE * v
        if kkt_from(cand, residual(op, cand), gamma) <= scale:
            return cand, True
    return w, False
