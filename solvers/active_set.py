"""Fast exact KMM solver (paper eq. kmm_l1_penalized): active-set solves certified by their KKT conditions.

For a support A with signs s the penalised optimum solves K_AA w_A = beta_A - gamma s_A. Sparse
solutions: primal-dual active set (PDAS: A and s from the fixed point w_i = soft(w_i + d_i / K_ii,
gamma / K_ii), d = beta - K w) straight at gamma (stopped when it cycles or diverges), then with gamma
continuation and orthant-projected Newton; where N > p or in the gradient form, the LARS homotopy on a
working set of candidates grown by KKT violators goes first. Dense solutions: ADMM with K + rho I
factored once in float32 (rho in proportion to gamma / max|beta|), polished by an exact solve on the ADMM
iterate's support and signs once they hold still. Large support systems factor in float32 and are refined
to float64 accuracy (solvers.linalg).
Rank-deficient K of known rank (N > p), where supports larger than the rank are singular: the LARS-lasso
homotopy (solvers.homotopy) when affordable, after the working set for sparse solutions of many candidates.
Other degenerate cases (duplicated candidates): an NNLS polish on the equicorrelation set, then the CVXPY
reference, then coordinate descent. The budget form follows the penalised path (solve_budget): read off the
homotopy's breakpoints, or bracketed on a gamma grid.
"""

from __future__ import annotations

import time

import numpy as np

from solvers.homotopy import affordable, deficient, distinct, expand, lars, path_at
from solvers.operators import GramOperator
from solvers.problem import objective_from_residual


def _late(deadline: float | None) -> bool:
    return deadline is not None and time.perf_counter() > deadline


def residual(op, w: np.ndarray) -> np.ndarray:
    """r = K w - beta, reading only w's support through the operator."""
    support = np.flatnonzero(w)
    return op.apply(support, w[support]) - op.beta


def _objective(w: np.ndarray, r: np.ndarray, beta: np.ndarray, gamma: float) -> float:
    return objective_from_residual(w, r, beta, gamma * float(np.abs(w).sum()))


def _kkt_from(w: np.ndarray, r: np.ndarray, gamma: float) -> float:
    on = w != 0
    v1 = np.abs(r[on] + gamma * np.sign(w[on])).max(initial=0.0)
    v2 = (np.abs(r[~on]) - gamma).max(initial=0.0)
    return float(max(v1, v2, 0.0))


def _pdas_plain(op, gamma: float, w: np.ndarray, max_iter: int, scale: float,
                deadline: float | None = None, r: np.ndarray | None = None,
                diverging: int | None = 2) -> tuple[np.ndarray, int, bool]:
    """Plain PDAS (full Newton jumps); stops at a KKT point, on a cycle, on divergence, or at max_iter; returns
    the best iterate.

    r, when given, is the residual K w - beta at w (saves a product). diverging: stop after this many objective
    increases in a row (None: never). PDAS is not monotone, but where it fails straight at a small gamma its
    objective climbs at every step while its supports grow toward N, each a larger factorisation
    (bench/sparse_chain.py).
    """
    beta = op.beta
    diag = np.maximum(op.diag, 1e-300)
    if r is None:
        r = residual(op, w)
    f = _objective(w, r, beta, gamma)
    best_w, best_f = w, f
    seen: set[bytes] = set()
    rises = 0
    for it in range(1, max_iter + 1):
        if _kkt_from(w, r, gamma) <= scale:
            return w, it - 1, True
        if diverging is not None and rises >= diverging:
            break
        u = diag * w - r
        A = np.flatnonzero(np.abs(u) > gamma)
        s = np.sign(u[A])
        key = A.tobytes() + s.tobytes()
        if key in seen or _late(deadline) or A.size > getattr(op, "rank_bound", op.n):
            break  # a cycle, out of time, or a support too large to be nonsingular (N > p)
        seen.add(key)
        w = np.zeros_like(w)
        if A.size:
            w[A], r = op.solve_support_residual(A, beta[A] - gamma * s)
        else:
            r = -beta
        f, f_before = _objective(w, r, beta, gamma), f
        rises = rises + 1 if f > f_before else 0
        if f < best_f:
            best_w, best_f = w, f
    converged = _kkt_from(w, r, gamma) <= scale
    return (w if converged else best_w), len(seen), converged  # one support solve per pattern seen


def _orthant_newton(op, gamma: float, w: np.ndarray, max_iter: int, scale: float,
                    deadline: float | None = None) -> tuple[np.ndarray, int, bool]:
    """Orthant-projected Newton with Armijo backtracking (monotone; many coordinates may leave per step).

    The orthant xi keeps the signs of the support and opens zero coordinates whose pseudo-gradient
    allows descent; the Newton point solves the support system on xi's support; the trial points
    P_xi(w + t (z - w)) clamp coordinates that would change sign to zero.
    """
    beta = op.beta
    r = residual(op, w)
    f = _objective(w, r, beta, gamma)
    lipschitz = float(np.maximum(op.diag, 0).sum())
    for it in range(1, max_iter + 1):
        if _kkt_from(w, r, gamma) <= scale:
            return w, it - 1, True
        if _late(deadline):
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
            f_trial = _objective(trial, r_trial, beta, gamma)
            if f_trial <= f + 1e-4 * float(pg @ (trial - w)):
                accepted = True
                break
            t *= 0.5
        if not accepted:  # no descent along the Newton arc: one proximal-gradient step
            x = w - r / lipschitz
            trial = np.sign(x) * np.maximum(np.abs(x) - gamma / lipschitz, 0.0)
            moved = np.flatnonzero(trial != w)
            if moved.size == 0:
                return w, it, _kkt_from(w, r, gamma) <= scale
            r_trial = r + op.apply(moved, (trial - w)[moved])
            f_trial = _objective(trial, r_trial, beta, gamma)
        w, r, f = trial, r_trial, f_trial
        if it % 20 == 0:  # refresh r against drift from the incremental updates
            r = residual(op, w)
    return w, max_iter, _kkt_from(w, r, gamma) <= scale


def pdas(op, gamma: float, w: np.ndarray, max_iter: int = 200, tol: float = 1e-10,
         deadline: float | None = None) -> tuple[np.ndarray, int, bool]:
    """Active-set solve at one gamma from a warm start w; (w, iterations, converged).

    Phase 1, plain PDAS: jump to the Newton point of the support chosen by the fixed-point rule
    (superlinear near the solution, but it may cycle). Phase 2, from phase 1's best iterate if
    it stalled: orthant-projected Newton with Armijo backtracking, which cannot cycle.
    """
    w = np.asarray(w, dtype=np.float64).copy()
    scale = tol * max(1.0, float(np.abs(op.beta).max()))
    w, n_plain, ok = _pdas_plain(op, gamma, w, min(max_iter, 15), scale, deadline)
    if ok:
        return w, n_plain, True
    w, n_newton, ok = _orthant_newton(op, gamma, w, max_iter, scale, deadline)
    return w, n_plain + n_newton, ok


def coordinate_descent(op, gamma: float, w: np.ndarray, *, max_sweeps: int = 10_000,
                       tol: float = 1e-12, deadline: float | None = None) -> tuple[np.ndarray, int]:
    """Cyclic coordinate descent (the slow, always-convergent fallback); needs op.K or forms columns."""
    w = np.asarray(w, dtype=np.float64).copy()
    r = residual(op, w)
    diag = op.diag
    for sweep in range(1, max_sweeps + 1):
        if _late(deadline):
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
    return _kkt_from(w, residual(op, w), gamma)


def _admm_polish(op, gamma: float, w0: np.ndarray, scale: float, *, rho: float = 0.3, alpha: float = 1.6,
                 max_iter: int = 2000, settle: int = 3,
                 deadline: float | None = None) -> tuple[np.ndarray, int, bool]:
    """ADMM on w = z (K + rho I factored once), polished every few iterations by an exact support solve.

    The OSQP strategy specialised to a dense PSD K: the ADMM iterate identifies the support and
    signs, and the polish (the support solve on them, then PDAS) makes the answer exact once they are right.
    The polish runs once they have held for `settle` iterations (bench/admm_rho.py: 3 beats 1 and 2, whose
    failed early polishes cost a factorisation each), or on a geometric schedule.
    """
    n = op.n
    rho = rho * float(np.mean(op.diag))
    solve = op.shifted_solver(rho)
    z = np.asarray(w0, dtype=np.float64).copy()
    u = np.zeros(n)  # scaled dual variable
    it, next_polish, stable, pattern = 0, 25, 0, b""
    while it < max_iter and not _late(deadline):
        w = solve(op.beta + rho * (z - u))
        x = alpha * w + (1 - alpha) * z + u
        z_old = z
        z = np.sign(x) * np.maximum(np.abs(x) - gamma / rho, 0.0)
        u = x - z
        it += 1
        signs = np.sign(z).astype(np.int8).tobytes()
        stable = stable + 1 if signs == pattern else 0
        pattern = signs
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
        if it == next_polish or (stable == settle and it >= 5):
            next_polish = max(next_polish, int(it * 1.6) + 5)
            wp, k, ok = _polish(op, gamma, z, scale)
            if ok:
                return wp, it + k, True
            if it >= 200:  # singular supports (duplicates, N > p): polish by NNLS on the equicorrelation set
                wp, ok = _nnls_polish(op, gamma, z, scale, deadline)
                if ok:
                    return wp, it, True
    return z, it, False


def _polish(op, gamma: float, z: np.ndarray, scale: float) -> tuple[np.ndarray, int, bool]:
    """The exact solution on z's support and signs, then up to two PDAS steps from it; (w, steps, converged).

    The support solve comes first because z is only approximate: the PDAS rule applied to z itself can pick
    another support even when z's signs are already those of the optimum (instrumented at N = 1000,
    gamma = 5e-4 with rho from _admm_rho: two or three failed factorisations where one support solve is
    exact). bench/admm_rho.py at the fixed rho = 0.3: 1.08x faster than the PDAS rule alone (geometric mean).
    """
    A = np.flatnonzero(z)
    w = np.zeros_like(z)
    r = None
    if A.size:
        w[A], r = op.solve_support_residual(A, op.beta[A] - gamma * np.sign(z[A]))
    wp, k, ok = _pdas_plain(op, gamma, w, 2, scale, r=r)  # returns w itself, after 0 steps, when it is optimal
    return wp, 1 + k, ok


def _homotopy(op, gamma: float, scale: float) -> tuple[np.ndarray, int, bool]:
    """The homotopy's solution at gamma, certified by its KKT (two PDAS steps if round-off left it short)."""
    _, W, steps = lars(op, gamma, return_path=False)
    w = W[-1]
    wp, k, ok = _pdas_plain(op, gamma, w, 2, scale)  # w itself, after 0 steps, when it certifies
    return wp, steps + k, ok


#: the working-set homotopy's first set (the largest |beta|) and its largest set (LARS costs about |W|^3 on it).
#: bench/sparse_chain.py --starts 64 128 256 (24 cases): geometric means 67, 49 and 45 ms; 128 and 256 each
#: fastest in 12 cases, 64 in none (it needs more rounds)
WORKING_SET_START = 128
WORKING_SET_MAX = 1024
#: on a rank-deficient K small enough for the full homotopy, the working set still goes first for sparse solutions
#: (gamma >= WORKING_SET_FIRST_RATIO * max|beta|) of at least WORKING_SET_FIRST_MIN_N candidates: scikit-learn's
#: LARS copies all of K (72 MB at N = 3000) for a path of a few dozen steps, the working set only its small sets.
#: bench/rank_deficient.py --scan (30 cases, N = 300-4000): 1.2-5.9x faster (geometric mean 2.31x) in the 12 cases
#: this rule picks; 0.71x in the other 18 (0.30x at N = 300, 0.63x at 1 % of max|beta|)
WORKING_SET_FIRST_MIN_N = 2000
WORKING_SET_FIRST_RATIO = 0.03


def _working_set_homotopy(op, gamma: float, scale: float, deadline: float | None = None, *,
                          start: int | None = None) -> tuple[np.ndarray, int, bool]:
    """The homotopy on a working set W grown by the candidates that violate KKT outside it; (w, steps, converged).

    For sparse solutions where PDAS's supports can exceed the rank (N > p), so that plain PDAS stops at once and
    continuation jumps to such supports at every stage, and for the gradient form, where a support of s costs
    s^2 p to form: LARS on the few candidates of W (one of each duplicate group) is exact, and w is optimal
    once no candidate outside W has |r_i| > gamma. Each round adds the worst violators,
    at most doubling W; past WORKING_SET_MAX candidates it gives up and the chain goes on. start: the size of the
    first W (WORKING_SET_START when None, read at call time like WORKING_SET_MAX).
    """
    n = op.n
    start = WORKING_SET_START if start is None else start
    cap = min(n, WORKING_SET_MAX)
    W = np.sort(np.argsort(-np.abs(op.beta), kind="stable")[:min(cap, start)])
    w, steps = np.zeros(n), 0
    while not _late(deadline):
        # the Gram form of W for both operators (scikit-learn's LARS on the gradients stops early on small
        # residues), one candidate of each duplicate group (LARS ends at a wrong point on exact ties)
        sub, keep = distinct(GramOperator(op.sub(W), op.beta[W]))
        _, path, k = lars(sub, gamma, return_path=False)
        steps += k
        w = np.zeros(n)
        w[W] = expand(path[-1], keep, W.size)
        r = residual(op, w)
        violates = np.abs(r) > gamma + scale
        violates[W] = False  # only candidates outside W can grow it
        violators = np.flatnonzero(violates)
        if violators.size == 0:  # w itself when it certifies, else two PDAS steps (round-off in LARS)
            wp, k, ok = _pdas_plain(op, gamma, w, 2, scale, r=r)
            return wp, steps + k, ok
        room = cap - W.size
        if room <= 0:
            break
        worst = violators[np.argsort(-np.abs(r[violators]), kind="stable")]
        W = np.union1d(W, worst[:min(room, max(W.size, 32))])
    return w, steps, False


def _continuation(op, gamma: float, factor: float, max_iter: int,
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


def _admm_rho(gamma: float, gmax: float) -> float:
    """ADMM's first rho relative to mean K_ii, in proportion to gamma / max|beta| (both ratios scale-free).

    Denser solutions (smaller gamma) converge faster with a smaller rho. bench/admm_rho.py against the former
    fixed rho = 0.3 (36 clustered cases, N = 300-2000, gamma / max|beta| from 3e-4 to 8e-3): fewer solver
    iterations in 29, the same in 3, more in 4; 1.32x faster (geometric mean); 22 -> 11 at N = 1000, gamma = 5e-4.
    """
    return float(np.clip(125.0 * gamma / gmax, 0.01, 1.0))


def _nnls_polish(op, gamma: float, w: np.ndarray, scale: float,
                 deadline: float | None = None) -> tuple[np.ndarray, bool]:
    """Exact solution on the (slightly enlarged) equicorrelation set of a near-optimal w, sign-consistent.

    With E = {i : |d_i| ~ gamma}, s = sign(d_E), the optimum solves K_EE w_E = beta_E - gamma s_E with
    s_i w_i >= 0: a non-negative least-squares problem in v = s * w_E (Lawson-Hanson: exact and
    fine with singular K_EE, where the support system is underdetermined).
    """
    from scipy.optimize import nnls

    d = -residual(op, w)
    for rel in (1e-7, 1e-5, 1e-3, 1e-2, 3e-2):
        if _late(deadline):  # each NNLS on a large E can take seconds
            break
        E = np.flatnonzero(np.abs(d) >= gamma * (1 - rel))
        if E.size == 0 or E.size > 3000:
            continue
        sE = np.sign(d[E])
        M = op.sub(E) * sE[None, :]
        v, _ = nnls(M, op.beta[E] - gamma * sE, maxiter=50 * E.size)
        cand = np.zeros_like(w)
        cand[E] = sE * v
        if _kkt_from(cand, residual(op, cand), gamma) <= scale:
            return cand, True
    return w, False


def solve_penalised(op, gamma: float, *, w0: np.ndarray | None = None, factor: float = 0.25,
                    max_iter: int = 200, dense_ratio: float = 0.01, admm_max_n: int = 20000,
                    tol: float = 1e-10, max_seconds: float | None = None) -> tuple[np.ndarray, dict]:
    """argmin 0.5 w'Kw - beta'w + gamma ||w||_1 through the operator; (w, info).

    Strategy: rank-deficient problems of known rank start with the homotopy when it is affordable (a warm
    start does not help it; give it distinct candidates: solvers.homotopy.deduplicated), after the working-set
    homotopy for sparse solutions of many candidates. Otherwise a warm
    start goes first; for sparse solutions (gamma >= dense_ratio * max|beta|) plain PDAS from zero, then PDAS
    with continuation, then the working-set homotopy (which goes first where N > p or in the gradient form);
    dense solutions start with ADMM + polish
    (N <= admm_max_n). Whatever has not converged goes on to orthant-projected Newton, and coordinate descent
    is the last resort.
    """
    gmax = float(np.abs(op.beta).max())
    if gamma >= gmax:
        return np.zeros(op.n), {"iterations": 0, "strategy": "zero", "converged": True, "fallback": None}
    scale = tol * max(1.0, gmax)
    deadline = None if max_seconds is None else time.perf_counter() + max_seconds
    # ADMM factors an N x N (Gram) or p x p (gradients) matrix once per rho. Up to N = 20000 (the pipeline's
    # Gram limit) that beats the PDAS chain on dense supports: bench/large_gram.py, N = 10000, p = 2048:
    # 6.7 s exact, where the chain stopped at its 120 s cap with KKT 6.6e-3
    can_admm = hasattr(op, "shifted_solver") and (op.n <= admm_max_n or not hasattr(op, "K"))

    def admm() -> tuple[np.ndarray, int, bool]:
        # ADMM's speed depends on rho; degenerate (rank-deficient) problems may need another scale
        total, best = 0, np.zeros(op.n)
        for rho in (_admm_rho(gamma, gmax), 3.0, 0.03):
            if _late(deadline):
                break
            w, it, ok = _admm_polish(op, gamma, np.zeros(op.n), scale, rho=rho, max_iter=1000, deadline=deadline)
            total += it
            if ok:
                return w, total, True
            best = _closer(op, gamma, best, w)  # an unfinished run's iterate, not a later run's zero start
        return best, total, False

    continuation = ("pdas_continuation", lambda: _continuation(op, gamma, factor, max_iter, deadline))
    grown = ("working_set_homotopy", lambda: _working_set_homotopy(op, gamma, scale, deadline))
    if affordable(op):
        # PDAS would jump to singular supports larger than the rank and ADMM crawls (bench/rank_deficient.py)
        chain = [("homotopy", lambda: _homotopy(op, gamma, scale))]
        if op.n >= WORKING_SET_FIRST_MIN_N and gamma >= WORKING_SET_FIRST_RATIO * gmax:
            chain.insert(0, grown)
    elif w0 is not None:
        chain = [("warm_pdas", lambda: pdas(op, gamma, w0, max_iter, deadline=deadline))]
    elif gamma >= dense_ratio * gmax or not can_admm:
        # sparse solutions on a full-rank Gram: plain PDAS straight at gamma usually lands in a few Newton steps
        # (measured: 0.5 vs 1.5 ms at N = 100), and continuation from gamma_max is fast where it stops. Where N > p
        # (PDAS's first support, every |beta_i| > gamma, can exceed the rank) or in the gradient form (a support
        # of s candidates costs s^2 p to form), the working-set homotopy goes first: its systems stay small
        # (bench/sparse_chain.py)
        direct = ("pdas_direct", lambda: _pdas_plain(op, gamma, np.zeros(op.n), 15, scale, deadline))
        chain = ([grown, direct, continuation] if deficient(op) or not hasattr(op, "K")
                 else [direct, continuation, grown])
    else:
        chain = [("admm_polish", admm)]
    chain += [(n, f) for n, f in (continuation, ("admm_polish", admm))
              if (n != "admm_polish" or can_admm) and n not in {c[0] for c in chain}]
    iters, best = 0, None
    for name, run in chain:
        strategy = name
        w, it, ok = run()
        iters += it
        if ok:
            break
        # the fallbacks start from the closest iterate any strategy reached
        best = w if best is None else _closer(op, gamma, best, w)
    if not ok:
        w = best
    fallback = None
    if not ok:
        w, ok = _nnls_polish(op, gamma, w, scale, deadline)
        fallback = "nnls_polish"
    if not ok and op.n <= 3000 and not _late(deadline):
        # a degenerate problem the active-set paths could not certify: the reference library
        from solvers.problem import KMMProblem
        from solvers.reference import solve_cvxpy

        K = op.K if hasattr(op, "K") else op.sub(np.arange(op.n))
        w_ref, _ = solve_cvxpy(KMMProblem(K=K, beta=op.beta, gamma=gamma), tolerance="tight")
        w_ref = np.where(np.abs(w_ref) > 1e-12 * max(1.0, float(np.abs(w_ref).max())), w_ref, 0.0)
        w_ref, polished = _nnls_polish(op, gamma, w_ref, scale)
        ok = polished or _kkt_from(w_ref, residual(op, w_ref), gamma) <= 1e3 * scale
        w = w_ref if ok else _closer(op, gamma, w, w_ref)
        fallback = "cvxpy_reference"
    if not ok and not _late(deadline):
        w_cd, sweeps = coordinate_descent(op, gamma, w, max_sweeps=5000, tol=1e-9, deadline=deadline)
        iters += sweeps
        w_cd, ok = _nnls_polish(op, gamma, w_cd, scale, deadline)
        w = w_cd if ok else _closer(op, gamma, w, w_cd)
        fallback = "coordinate_descent+nnls_polish"
    return w, {"iterations": iters, "strategy": strategy, "converged": ok, "fallback": fallback}


def _closer(op, gamma: float, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Whichever of two uncertified iterates has the smaller KKT violation (a on a tie)."""
    return b if _kkt_from(b, residual(op, b), gamma) < _kkt_from(a, residual(op, a), gamma) else a


def _budget_on_homotopy(op, budget: float, gmax: float) -> tuple[np.ndarray, dict] | None:
    """The budget's solution between two breakpoints of the homotopy (w and ||w||_1 are affine there), or
    None when the interpolated point does not certify."""
    scale = 1e-10 * max(1.0, gmax)
    gammas, W, steps = lars(op, gmax * 1e-12, return_path=True)
    l1 = np.abs(W).sum(axis=1)  # non-decreasing along the path, affine between breakpoints
    binding = bool(l1[-1] >= budget)
    if binding:
        g = float(np.interp(budget, l1, gammas))
        w = path_at(gammas, W, g)[0]
    else:  # the budget never binds: the (min-l1) unconstrained optimum, if the path got there
        w, g = W[-1], 0.0
    if _kkt_from(w, residual(op, w), g) > scale:
        return None
    return w, {"iterations": steps, "gamma": g, "binding": binding, "converged": True, "strategy": "homotopy"}


def solve_budget(op, budget: float, *, max_iter: int = 100) -> tuple[np.ndarray, dict]:
    """argmin 0.5 w'Kw - beta'w s.t. ||w||_1 <= budget, through the penalised path.

    ||w(gamma)||_1 is non-increasing in gamma and, where the support and signs are constant,
    w(gamma) is affine; read the budget off the homotopy's breakpoints when it is affordable, else
    bracket it on a gamma grid; then interpolate exactly.
    """
    gmax = float(np.abs(op.beta).max())
    if affordable(op):
        found = _budget_on_homotopy(op, budget, gmax)
        if found is not None:
            return found
    hi_g, hi_w = gmax, np.zeros(op.n)
    g, w, iters = gmax, np.zeros(op.n), 0
    lo = None
    floor = gmax * 1e-12
    while g > floor:
        g = max(g * 0.25, floor)
        w, info = solve_penalised(op, g, w0=w, max_iter=max_iter)
        iters += info["iterations"]
        if np.abs(w).sum() >= budget:
            lo = (g, w)
            break
        hi_g, hi_w = g, w
    if lo is None:  # the budget never binds: the (min-l1) unconstrained optimum
        return w, {"iterations": iters, "gamma": 0.0, "binding": False, "converged": True}
    lo_g, lo_w = lo

    def pattern(x: np.ndarray) -> bytes:
        A = np.flatnonzero(x)
        return A.tobytes() + np.sign(x[A]).tobytes()

    scale = 1e-10 * max(1.0, gmax)
    for it in range(200):
        l_hi, l_lo = np.abs(hi_w).sum(), np.abs(lo_w).sum()
        t = (budget - l_hi) / (l_lo - l_hi) if l_lo > l_hi else 1.0
        if pattern(hi_w) == pattern(lo_w):
            w = hi_w + t * (lo_w - hi_w)
            return w, {"iterations": iters, "gamma": hi_g + t * (lo_g - hi_g), "binding": True, "converged": True}
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
                    if np.all(np.sign(w_c[A]) == sA) and _kkt_from(w_c, residual(op, w_c), g_c) <= scale:
                        return w_c, {"iterations": iters + it, "gamma": g_c, "binding": True, "converged": True}
                    g_mid = g_c
        if g_mid is None or it % 2:  # alternate with bisection so neither end stagnates
            g_mid = 0.5 * (hi_g + lo_g)
        w_mid, info = solve_penalised(op, g_mid, w0=lo_w, max_iter=max_iter)
        iters += info["iterations"]
        l_mid = np.abs(w_mid).sum()
        if abs(l_mid - budget) <= 1e-13 * max(1.0, budget):
            return w_mid, {"iterations": iters, "gamma": g_mid, "binding": True, "converged": True}
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
    return w, {"iterations": iters, "gamma": hi_g + t * (lo_g - hi_g), "binding": True, "converged": True}
