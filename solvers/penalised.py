"""Fast exact KMM solver (paper eq. kmm_l1_penalized): the order of strategies, each certified by its KKT conditions.

For a support A with signs s the penalised optimum solves K_AA w_A = beta_A - gamma s_A. Sparse
solutions: primal-dual active set (PDAS: A and s from the fixed point w_i = soft(w_i + d_i / K_ii,
gamma / K_ii), d = beta - K w) straight at gamma (stopped when it cycles or diverges), then with gamma
continuation and orthant-projected Newton; where N > p or in the gradient form, the LARS homotopy on a
working set of candidates grown by KKT violators goes first. Dense solutions: ADMM with K + rho I
factored once in float32 (rho in proportion to gamma / max|beta|), polished by an exact solve on the ADMM
iterate's support and signs once they hold still; where K is rank-deficient or large, a working set of at most
SPARSE_PROBE_MAX candidates is tried first (a gamma dense by its ratio can have a sparse solution).
Large support systems factor in float32 and are refined to float64 accuracy (convalue.solvers.linalg).
Rank-deficient K of known rank (N > p), where supports larger than the rank are singular: the LARS-lasso
homotopy (convalue.solvers.homotopy) when affordable, after the working set for sparse solutions of many candidates.
Other degenerate cases (duplicated candidates): an NNLS polish on the equicorrelation set, then the CVXPY
reference, then coordinate descent. The methods live in convalue.solvers.active_set (PDAS and its safeguards),
convalue.solvers.admm, convalue.solvers.working_set and convalue.solvers.homotopy; the budget form (convalue.solvers.budget) follows this path.
"""

from __future__ import annotations

import time

import numpy as np

from convalue.solvers import active_set, admm, working_set
from convalue.solvers.active_set import kkt_from, past_deadline, residual
from convalue.solvers.homotopy import affordable, deficient, distinct, expand, lars

#: on a rank-deficient K small enough for the full homotopy, the working set still goes first for sparse solutions
#: (gamma >= WORKING_SET_FIRST_RATIO * max|beta|) of at least WORKING_SET_FIRST_MIN_N candidates: scikit-learn's
#: LARS copies all of K (72 MB at N = 3000) for a path of a few dozen steps, the working set only its small sets.
#: bench/rank_deficient.py --scan (30 cases, N = 300-4000): 1.2-5.9x faster (geometric mean 2.31x) in the 12 cases
#: this rule picks; 0.71x in the other 18 (0.30x at N = 300, 0.63x at 1 % of max|beta|)
WORKING_SET_FIRST_MIN_N = 2000
WORKING_SET_FIRST_RATIO = 0.03


def prefers_working_set(n: int, gamma: float, gmax: float) -> bool:
    """True where the working set goes before the full homotopy on an affordable rank-deficient K (gmax: max|beta|)."""
    return n >= WORKING_SET_FIRST_MIN_N and gamma >= WORKING_SET_FIRST_RATIO * gmax


#: solutions at gamma below this fraction of max|beta| are dense: ADMM + polish goes first (unless warm-started)
DENSE_RATIO = 0.01


def prefers_gram_form(op, gamma: float) -> bool:
    """True for a gradient-form operator with N <= p at a dense gamma, which is faster solved on K = G G^T formed once.

    There ADMM would form and factor the p x p matrix rho I + G^T G (N p^2 + p^3 / 3 flops, p^2 floats) where K costs
    N^2 p flops and N^2 floats, and every support system would be a product G_A G_A^T where the Gram form gathers
    it. bench/gradient_form.py: see README.
    """
    return not hasattr(op, "K") and op.n <= op.G.shape[1] and gamma < DENSE_RATIO * float(np.abs(op.beta).max())


#: a gamma dense by DENSE_RATIO can still have a sparse solution (near-parallel gradients: 5 of 5000 candidates
#: active at 1e-3 max|beta|), where ADMM crawls (3.4-451 s, bench/sparse_probe.py). Where K is rank-deficient, or
#: has at least SPARSE_PROBE_MIN_N candidates, the working-set homotopy is tried first, from SPARSE_PROBE_START
#: candidates up to SPARSE_PROBE_MAX (0: never; all read at call time): 4-7 ms where it gives up (clustered data,
#: N = 1000-5000; 38-42 ms with (128, 256)), against a dense solve of 7 ms at N = 1000, 41 ms at 2000, 164 ms at 3000
SPARSE_PROBE_START = 32
SPARSE_PROBE_MAX = 64
SPARSE_PROBE_MIN_N = 2000


#: a gamma dense by DENSE_RATIO whose solution has more active candidates than the probe's cap but a few hundred at
#: most (near-parallel gradients, the target a mix of 30-100 of them): ADMM fails there at all three rho (36, 199
#: and 20 s at N = 3000 > p = 1000, 312 active) and continuation takes minutes, where the working-set homotopy
#: certifies in 0.26 s. So ADMM's first rho runs this many steps first (on clustered data it converges in under
#: 100), then the working set, then ADMM in full (0: ADMM in full at once; read at call time)
ADMM_FIRST_STEPS = 200
#: ... that working set grows to twice the usual cap (as the budget form's does): a mix of 300 such rows at
#: N = 3000 > p = 1000 (781 active) needed more than 1024 in W to certify (4.7 s to give up, then ADMM past 60 s) and
#: took 11.2 s with 2048; at 2000 x 4096 (653 active) 1.6 s where 1024 gave up after 1.0 s
ADMM_FIRST_WORKING_SET_MAX = 2048
#: ... and where that gives up too on a rank-deficient K of N * rank^2 up to this (past the homotopy's usual limit,
#: convalue.solvers.homotopy.HOMOTOPY_MAX_WORK), the full homotopy goes before ADMM in full: near-parallel N = 3000 > p = 1000
#: with 973 of the rank's 1000 active took it 6.1 s, exact, where the chain was uncertified past 60 s
HOMOTOPY_FALLBACK_WORK = 8e9
#: ... and, where K is formed, that working set starts from the iterate ADMM's first steps reached (its nonzeros, the
#: largest |w| first, beside the largest |beta|; read at call time): each round of the working set reruns LARS from
#: gamma_max, so starting near the support's size saves rounds. Where that iterate has as many nonzeros as the working
#: set's cap, the seeded W would start full with no room to grow (it gave up in all five such cases, N = 2500-5000 >
#: p, after 4.3-23 s), so the homotopy fallback goes before it. bench/sparse_probe.py --versus seed (18 near-parallel
#: cases at 1e-3 max|beta|, 30-1381 active): 0.83-5.75x, 1.61x by geometric mean, 186 -> 69 s in all; 6.8 -> 1.9 s at
#: 1500 x 4096 with 1210 active (ADMM's iterate: 1500 nonzeros), 56.6 -> 9.9 s at 2500 x 1500 with 1381. The seed is
#: not used in the gradient form, where W's Gram costs |W|^2 p to form (scratch: 0.91-1.03x); the order is (three cases,
#: --forms gradients: 24.9 -> 7.8 s at 3000 x 1000 with 973 active, 1.01x and 1.16x where it does not apply)
ADMM_FIRST_SEEDED = True

#: in the gradient form, the Gram-form homotopy on K = G G^T formed once is the fallback up to this N (K: 512 MB)
GRAM_HOMOTOPY_MAX_N = 8000


def _homotopy(op, gamma: float, scale: float) -> tuple[np.ndarray, int, bool]:
    """The homotopy's solution at gamma, certified by its KKT (two PDAS steps if round-off left it short).

    In the gradient form scikit-learn's LARS runs on X = G^T (no K), which can end off the path: at N = 3000,
    p = 500, gamma = 1e-3 max|beta| it stopped at KKT 5.5e-5 with 460 of the 461 candidates, where the same LARS
    on K is exact, and the chain's next strategies took over 300 s. There, up to GRAM_HOMOTOPY_MAX_N, the Gram form
    runs on K formed once (1.4 s in that case).
    """
    _, W, steps = lars(op, gamma, return_path=False)
    wp, k, ok = active_set.pdas_plain(op, gamma, W[-1], 2, scale)  # w itself, after 0 steps, when it certifies
    if not ok and not hasattr(op, "K") and op.n <= GRAM_HOMOTOPY_MAX_N:
        _, W, more = lars(op.gram(), gamma, return_path=False)
        wp, k2, ok = active_set.pdas_plain(op, gamma, W[-1], 2, scale)
        steps, k = steps + more, k + k2
    return wp, steps + k, ok


def _distinct_homotopy(op, gamma: float, scale: float) -> tuple[np.ndarray, int, bool]:
    """_homotopy on one candidate of every duplicate group (what the entry points do for an affordable problem), put
    back on all candidates."""
    sub, keep = distinct(op)
    w, k, ok = _homotopy(sub, gamma, scale)
    return expand(w, keep, op.n), k, ok


def solve_penalised(op, gamma: float, *, w0: np.ndarray | None = None, factor: float = 0.25,
                    max_iter: int = 200, dense_ratio: float = DENSE_RATIO, admm_max_n: int = 20000,
                    tol: float = 1e-10, stop_tol: float | None = None,
                    max_seconds: float | None = None) -> tuple[np.ndarray, dict]:
    """argmin 0.5 w'Kw - beta'w + gamma ||w||_1 through the operator; (w, info).

    Strategy: rank-deficient problems of known rank start with the homotopy when it is affordable (a warm
    start does not help it; give it distinct candidates: convalue.solvers.homotopy.deduplicated), after the working-set
    homotopy for sparse solutions of many candidates. Otherwise a warm
    start goes first; for sparse solutions (gamma >= dense_ratio * max|beta|) plain PDAS from zero, then PDAS
    with continuation, then the working-set homotopy (which goes first where N > p or in the gradient form);
    dense solutions start with ADMM + polish (N <= admm_max_n), after a capped working-set homotopy where K is
    rank-deficient or N >= SPARSE_PROBE_MIN_N. Whatever has not converged goes on to orthant-projected Newton, and
    coordinate descent is the last resort.

    tol: the KKT violation, relative to max(1, max|beta|), at which an answer is certified. stop_tol: ADMM may return
    its own iterate once its KKT violation (relative likewise) is at most this, instead of polishing it exact, where
    that is cheaper and K is well-conditioned enough for the tolerance to pin down the scores (convalue.solvers.admm); every
    other answer is certified at tol, as without it (at the looser stop_tol, on near-parallel gradients the working
    set certified 512 active where the optimum has 1209, its top 3 none of the exact top 3).
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
    stop_at = (stop_tol * max(1.0, gmax) if stop_tol is not None and stop_tol >= admm.EARLY_STOP_MIN_TOL
               else None)
    early_stopped = False  # whether ADMM's own iterate answered (run_admm sets it)
    first_iterate = None  # where ADMM's first steps (ADMM_FIRST_STEPS) did not finish, their iterate (run_admm sets it)

    def run_admm(first: int = 0) -> tuple[np.ndarray, int, bool]:
        # ADMM's speed depends on rho; degenerate (rank-deficient) problems may need another scale. first > 0: only
        # the first rho, for that many steps
        nonlocal early_stopped, first_iterate
        total, best = 0, np.zeros(op.n)
        for rho in (admm.admm_rho(gamma, gmax),) if first else (admm.admm_rho(gamma, gmax), 3.0, 0.03):
            if past_deadline(deadline):
                break
            w, it, ok, stopped = admm.admm_polish(op, gamma, np.zeros(op.n), scale, rho=rho, max_iter=first or 1000,
                                                   deadline=deadline, stop_at=stop_at)
            total += it
            if ok:
                early_stopped = stopped
                return w, total, True
            if first:
                first_iterate = w
            best = _closer(op, gamma, best, w)  # an unfinished run's iterate, not a later run's zero start
        return best, total, False

    def working(**sizes) -> tuple[str, object]:
        return "working_set_homotopy", lambda: working_set.working_set_homotopy(op, gamma, scale, deadline, **sizes)

    def seeded_wide() -> tuple[np.ndarray, int, bool]:
        seed = first_iterate if ADMM_FIRST_SEEDED and hasattr(op, "K") else None
        return working_set.working_set_homotopy(op, gamma, scale, deadline, max_size=ADMM_FIRST_WORKING_SET_MAX,
                                                seed=seed)

    stepped = ("pdas_continuation", lambda: active_set.continuation(op, gamma, factor, max_iter, deadline))
    grown = working()
    probe = working(start=SPARSE_PROBE_START, max_size=SPARSE_PROBE_MAX)
    admm_link = ("admm_polish", run_admm)
    wide = ("working_set_homotopy", seeded_wide)
    admm_first = [("admm_polish", lambda: run_admm(ADMM_FIRST_STEPS)), wide] if ADMM_FIRST_STEPS > 0 else []

    def fallback_homotopy(before_wide: bool) -> tuple[np.ndarray, int, bool] | None:
        # where ADMM's first iterate has as many nonzeros as the working set's cap, the seeded working set starts full
        # with no room to grow: the homotopy goes before it, else after it (None: skipped)
        full = (ADMM_FIRST_SEEDED and first_iterate is not None
                and np.count_nonzero(first_iterate) >= ADMM_FIRST_WORKING_SET_MAX)
        return _distinct_homotopy(op, gamma, scale) if full == before_wide else None

    if admm_first and not affordable(op) and affordable(op, HOMOTOPY_FALLBACK_WORK):
        admm_first[1:1] = [("homotopy", lambda: fallback_homotopy(True))]
        admm_first.append(("homotopy", lambda: fallback_homotopy(False)))
    probing = SPARSE_PROBE_MAX > 0 and (deficient(op) or op.n >= SPARSE_PROBE_MIN_N)
    dense_head = ([probe] if probing else []) + (admm_first + [admm_link] if can_admm else [])  # a cold dense start
    sparse = gamma >= dense_ratio * gmax
    grown_first = deficient(op) or not hasattr(op, "K")  # supports can outgrow the rank, or cost s^2 p to form
    if affordable(op):
        # PDAS would jump to singular supports larger than the rank and ADMM crawls (bench/rank_deficient.py)
        chain = [("homotopy", lambda: _homotopy(op, gamma, scale))]
        if prefers_working_set(op.n, gamma, gmax):
            chain.insert(0, grown)
    elif w0 is not None:
        chain = [("warm_pdas", lambda: active_set.pdas(op, gamma, w0, max_iter, deadline=deadline))]
        if grown_first:
            # what a cold start tries first goes before warm PDAS, which can jump to supports past the rank (a warm
            # start does not help the homotopy): the budget form's gamma grid on near-parallel gradients, N = 3000 >
            # p = 1000, spent 48 and 94 s at 0.25 and 0.625 max|beta| with 5 candidates active, warm PDAS and
            # continuation failing and ADMM finishing; now 0.5 s in all (bench/RESULTS.md)
            # at a dense gamma ADMM (which starts from zero) goes before warm PDAS too: clustered N = 3000 > p = 1000
            # at 9.8e-4 max|beta| (768 active), warm PDAS from the grid's last 338 ran past 200 s, ADMM cold 1.45 s
            chain[:0] = [grown] if sparse else dense_head
    elif sparse or not can_admm:
        # sparse solutions on a full-rank Gram: plain PDAS straight at gamma usually lands in a few Newton steps
        # (measured: 0.5 vs 1.5 ms at N = 100), and continuation from gamma_max is fast where it stops. Where N > p
        # (PDAS's first support, every |beta_i| > gamma, can exceed the rank) or in the gradient form (a support
        # of s candidates costs s^2 p to form), the working-set homotopy goes first: its systems stay small
        # (bench/sparse_chain.py)
        direct = ("pdas_direct", lambda: active_set.pdas_plain(op, gamma, np.zeros(op.n), 15, scale, deadline))
        chain = [grown, direct, stepped] if grown_first else [direct, stepped, grown]
    else:
        chain = dense_head
    chain += [(n, f) for n, f in (stepped, admm_link)
              if (n != "admm_polish" or can_admm) and n not in {c[0] for c in chain}]
    iters, best = 0, None
    for name, run in chain:
        out = run()
        if out is None:  # a link that does not apply after what the links before it found
            continue
        strategy = name
        w, it, ok = out
        iters += it
        if ok:
            break
        # the fallbacks start from the closest iterate any strategy reached
        best = w if best is None else _closer(op, gamma, best, w)
    if not ok:
        w = best
    fallback = None
    if not ok:
        w, ok = active_set.nnls_polish(op, gamma, w, scale, deadline)
        fallback = "nnls_polish"
    if not ok and op.n <= 3000 and not past_deadline(deadline):
        # a degenerate problem the active-set paths could not certify: the reference library
        from convalue.solvers.problem import KMMProblem
        from convalue.solvers.reference import solve_cvxpy

        K = op.K if hasattr(op, "K") else op.sub(np.arange(op.n))
        w_ref, _ = solve_cvxpy(KMMProblem(K=K, beta=op.beta, gamma=gamma), tolerance="tight")
        w_ref = np.where(np.abs(w_ref) > 1e-12 * max(1.0, float(np.abs(w_ref).max())), w_ref, 0.0)
        w_ref, polished = active_set.nnls_polish(op, gamma, w_ref, scale)
        ok = polished or kkt_from(w_ref, residual(op, w_ref), gamma) <= 1e3 * scale
        w = w_ref if ok else _closer(op, gamma, w, w_ref)
        fallback = "cvxpy_reference"
    if not ok and not past_deadline(deadline):
        w_cd, sweeps = active_set.coordinate_descent(op, gamma, w, max_sweeps=5000, tol=1e-9, deadline=deadline)
        iters += sweeps
        w_cd, ok = active_set.nnls_polish(op, gamma, w_cd, scale, deadline)
        w = w_cd if ok else _closer(op, gamma, w, w_cd)
        fallback = "coordinate_descent+nnls_polish"
    info = {"iterations": iters, "strategy": strategy, "converged": ok, "fallback": fallback}
    return w, info | ({"early_stop": True} if early_stopped else {})  # set only by the link that ended the chain


def _closer(op, gamma: float, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Whichever of two uncertified iterates has the smaller KKT violation (a on a tie)."""
    return b if kkt_from(b, residual(op, b), gamma) < kkt_from(a, residual(op, a), gamma) else a
