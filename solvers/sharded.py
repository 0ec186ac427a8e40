"""The gradient form with G held elsewhere (in shards): a working set W of candidates, grown by KKT violators, is
solved exactly on its own rows G_W by solve_kmm_gradients; the rest of G is reached only through callables the
caller provides (G u for a p-vector u, and G[rows]), so no process holds more of G than ShardPolicy allows.

The answer on W is optimal for all N once no candidate outside W has |r_i| > lambda, r = K w - beta. The check
reuses earlier products: r_i moves by g_i . (u - u_ref) when u = G^T w moves from a u_ref at which r_i is known, so
|r_i| <= |r_ref_i| + ||g_i|| ||u - u_ref|| (Cauchy-Schwarz) certifies most candidates without reading their rows;
the uncertain ones are read (their rows, when few) or one pass over the shards computes r for all. A prior answer
(w of an earlier, smaller pool, zeros for the new candidates, and its exact residual) is checked first: where it
still certifies it is the answer, else its support seeds W. Pure numpy: no Ray, nothing of convalue outside
convalue.solvers.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from convalue.solvers.active_set import kkt_from
from convalue.solvers.api import KKT_TOL, KMMSolution, solve_kmm_gradients
from convalue.solvers.policy import DEFAULT_POLICY, SolverPolicy
from convalue.solvers.problem import (
    KMMInputError,
    KMMSolveError,
    check_costs,
    check_finite,
    check_normalize,
    check_norms,
    check_settings,
    check_tol,
    objective_from_residual,
)

#: the KKT slack, relative to max(1, max|beta|), below which a candidate outside W does not join it
_SLACK = 1e-10
#: uncertain candidates are read this many rows at a time
_READ = 4096


@dataclass(frozen=True)
class ShardPolicy:
    """How much of G one process may hold, and how the working set grows."""

    #: the most bytes of G (float64) one process may gather: all of G at or below it, else working sets of rows
    #: (1 GiB: N = 100,000, p = 8192 at a dense gamma peaks at 6.83 GB summed PSS with it, 8.27 GB with 2 GiB)
    max_gather_bytes: int = 1 << 30
    #: the first working set: the candidates of largest |beta| (and a prior answer's support)
    start: int = 1024
    #: each round adds the worst violators outside W: up to this share of |W| ...
    growth: float = 1.0
    #: ... or at least this many (where there are); where W is full, its zeros with |r_i| below prune_below times
    #: the multiplier leave it first
    min_growth: int = 256
    prune_below: float = 0.75
    #: uncertain candidates (the bound does not clear them) are read as rows up to this share of N; more, and one
    #: pass over every shard computes all residuals
    read_rows_share: float = 0.05
    #: rows of G (float32) kept with a valuation for the next one of a grown pool: the support, the last working
    #: set, then the candidates closest to the KKT boundary (those a small change of w can make violate)
    keep_rows_bytes: int = 128 << 20

    def holds_all(self, n: int, p: int) -> bool:
        """Whether all of G (n x p float64) fits in one process under this policy."""
        return 8 * n * p <= self.max_gather_bytes

    def max_rows(self, p: int) -> int:
        """The largest working set: rows of p float64 within max_gather_bytes."""
        return int(self.max_gather_bytes // (8 * p))


DEFAULT_SHARD_POLICY = ShardPolicy()


@dataclass(frozen=True, eq=False)
class ShardedGradients:
    """G (n x p, in the run's metric) behind two callables: times(u) = G u (float64, length n) and rows(idx) = G[idx]
    (float64, idx sorted); beta = G g_tar and diag = the squared row norms, computed where the shards live."""

    n: int
    p: int
    beta: np.ndarray
    diag: np.ndarray
    times: Callable[[np.ndarray], np.ndarray]
    rows: Callable[[np.ndarray], np.ndarray]
    near: np.ndarray | None = None  # a mask of rows held beside the solver (rows() reads them at no cost)


@dataclass(frozen=True, eq=False)
class Prior:
    """An earlier answer on this problem's candidates: w (scores as solved, zeros for candidates added since) and,
    where known, its residual r~ = K~ w - beta~ in the normalised space (K~ = D^-1/2 K D^-1/2 with `normalize:
    cosine`): residual[i] exact at u_refs[ref[i]] (ref None: every row at u_refs[-1]), u_refs[-1] = G~^T w."""

    w: np.ndarray
    residual: np.ndarray | None = None
    u_refs: np.ndarray | None = None  # k x p
    ref: np.ndarray | None = None


@dataclass(frozen=True, eq=False)
class Residuals:
    """Where a solve left its residuals: r~ (normalised space) exact at u_refs[ref[i]]; u_refs[-1] = G~^T w. The
    next solve of a grown pool starts from it (Prior)."""

    residual: np.ndarray
    ref: np.ndarray
    u_refs: np.ndarray
    held: np.ndarray | None = None  # the last working set's candidates


def rows_to_keep(w: np.ndarray, residual: np.ndarray, held: np.ndarray | None, rows: int,
                 allowed: np.ndarray | None = None) -> np.ndarray:
    """Up to `rows` candidates (sorted) whose rows a valuation keeps: the support (largest |w| first), then the last
    working set, then the largest |r~_i| off it (the closest to the boundary |r~_i| = gamma); only `allowed` ones
    (a mask) where given."""
    order = [np.flatnonzero(w)[np.argsort(-np.abs(w[w != 0]), kind="stable")]]
    if held is not None:
        order.append(np.asarray(held, np.intp))
    order.append(np.argsort(-np.abs(residual), kind="stable"))
    ranked = _unique_first(np.concatenate(order).astype(np.intp))
    if allowed is not None:
        ranked = ranked[allowed[ranked]]
    return np.sort(ranked[:rows])


@dataclass
class _Record:
    """What the solve did (for KMMSolution.info["sharded"])."""

    rounds: list[dict] = field(default_factory=list)
    passes: int = 0
    rows_read: int = 0
    held_rows: int = 0
    prior: str = "none"

    def to_dict(self, p: int) -> dict:
        return {"rounds": self.rounds, "passes": self.passes, "rows_read": self.rows_read,
                "held_rows": self.held_rows, "held_bytes": 8 * p * self.held_rows, "prior": self.prior}


def prior_answer(w: np.ndarray, residual: np.ndarray, beta_n: np.ndarray, gamma: float, *,
                 costs: np.ndarray | None = None, tol: float | None = None) -> KMMSolution | None:
    """The penalised problem's answer where a prior w still certifies on its exact residual r~ = K~ w - beta~ (the
    normalised space; beta_n = beta~), else None: the warm start of a grown pool whose K is formed."""
    c = np.ones(len(w)) if costs is None else np.asarray(costs, np.float64)
    v, r_u, beta_u = c * np.asarray(w, np.float64), np.asarray(residual, np.float64) / c, beta_n / c
    scale = (tol or _SLACK) * max(1.0, float(np.abs(beta_u).max()))
    kkt = kkt_from(v, r_u, gamma)
    if kkt > scale or _status(kkt, beta_n, tol) != "optimal":
        return None
    objective = objective_from_residual(v, r_u, beta_u, gamma * float(np.abs(v).sum()))
    return KMMSolution(w=np.asarray(w, np.float64), objective=objective, status="optimal", kkt=kkt, form="penalised",
                       gamma=gamma, budget=None, method="prior", iterations=0,
                       info={"multiplier": gamma, "strategy": "prior", "converged": True})


def _status(kkt: float, beta_n: np.ndarray, tol: float | None) -> str:
    ok = kkt <= max(KKT_TOL, tol or 0.0) * max(1.0, float(np.abs(beta_n).max()))
    return "optimal" if ok else "inaccurate"


def solve_sharded(op: ShardedGradients, g_tar: np.ndarray, *, gamma: float | None = None, budget: float | None = None,
                  costs: np.ndarray | None = None, normalize: str = "none", tol: float | None = None,
                  policy: SolverPolicy = DEFAULT_POLICY, shard: ShardPolicy = DEFAULT_SHARD_POLICY,
                  prior: Prior | None = None) -> KMMSolution:
    """Solve KMM from G in shards (module docstring); the same problem, certificate and options as
    solve_kmm_gradients(G, g_tar, ...). Raises KMMSolveError where the working set would outgrow
    shard.max_gather_bytes before it certifies."""
    t0 = time.perf_counter()
    g = np.asarray(g_tar, dtype=np.float64)
    if g.shape != (op.p,):
        raise KMMInputError(f"g_tar must have length p = {op.p}, got shape {g.shape}")
    check_finite("g_tar", g)
    check_settings(gamma, budget)
    tol = check_tol(tol, gamma)
    check_normalize(normalize)
    diag = np.asarray(op.diag, np.float64)
    check_norms(diag, 0.0)
    c = check_costs(costs, op.n)
    s = 1.0 / np.sqrt(diag) if normalize == "cosine" else np.ones(op.n)
    t = s if c is None else s / c  # the unit-cost problem's row scale: G_u = diag(t) G, v = c w
    beta_n = s * np.asarray(op.beta, np.float64)
    beta_u, diag_u = t * op.beta, t * t * diag
    cost = np.ones(op.n) if c is None else c
    scale = (tol or _SLACK) * max(1.0, float(np.abs(beta_u).max()))
    cap = min(op.n, shard.max_rows(op.p))
    if cap < 1:
        raise KMMInputError(f"ShardPolicy.max_gather_bytes = {shard.max_gather_bytes} holds no row of p = {op.p}")
    rec = _Record()

    def done(v: np.ndarray, r_known: np.ndarray, kkt: float, lam: float, iters: int, info: dict,
             r_ref: np.ndarray, ref: np.ndarray, u_refs: list[np.ndarray], held: np.ndarray | None = None
             ) -> KMMSolution:
        w = v / cost
        objective = objective_from_residual(v, r_known, beta_u, gamma * float(np.abs(v).sum()) if gamma is not None
                                            else 0.0)
        status = _status(kkt, beta_n, tol)
        if status != "optimal":
            raise KMMSolveError(f"sharded gradient-space KMM solver did not converge: KKT violation {kkt:.3g}")
        info = info | {"multiplier": lam, "strategy": "sharded_working_set", "sharded": rec.to_dict(op.p),
                       "residuals": Residuals(residual=r_ref * cost, ref=ref, u_refs=np.stack(u_refs), held=held)}
        return KMMSolution(w=w, objective=objective, status=status, kkt=kkt, form="penalised" if gamma is not None
                           else "budget", gamma=gamma, budget=budget, method="sharded_gradients", iterations=iters,
                           time_s=time.perf_counter() - t0, info=info)

    if gamma is not None and gamma >= float(np.abs(beta_u).max()):
        rec.prior = "zero"
        return done(np.zeros(op.n), -beta_u, 0.0, gamma, 0, {"converged": True}, -beta_u,
                    np.zeros(op.n, dtype=np.intp), [np.zeros(op.p)])
    # the reference residuals: r_ref[i] is exact at u_refs[ref[i]]
    v0 = None if prior is None else cost * np.asarray(prior.w, np.float64)
    if prior is not None and prior.residual is not None and prior.u_refs is not None:
        r_ref = np.asarray(prior.residual, np.float64) / cost
        u_refs = [np.asarray(u, np.float64) for u in np.atleast_2d(prior.u_refs)]
        ref = (np.full(op.n, len(u_refs) - 1, dtype=np.intp) if prior.ref is None
               else np.asarray(prior.ref, np.intp).copy())
        if gamma is not None:  # the prior itself: exact on its support, bounded off it
            at = ref == len(u_refs) - 1
            drift = np.array([np.linalg.norm(u_refs[-1] - u) for u in u_refs])
            off = np.where(at, np.abs(r_ref), np.abs(r_ref) + np.sqrt(diag_u) * drift[ref])
            on = v0 != 0
            if np.all(at[on]):
                kkt = max(kkt_from(v0[on], r_ref[on], gamma), float(np.max(off[~on] - gamma, initial=0.0)))
                if kkt <= scale:
                    rec.prior = "certified"
                    r_known = np.where(on, r_ref, 0.0)
                    return done(v0, r_known, kkt, gamma, 0, {"converged": True}, r_ref, ref, u_refs)
        rec.prior = "seeded"
    else:
        r_ref, u_refs = -beta_u.copy(), [np.zeros(op.p)]  # w = 0: r = -beta, u = 0
        ref = np.zeros(op.n, dtype=np.intp)
        rec.prior = "none" if v0 is None else "support"
    # the first W: a prior's support, then (with a known prior residual) its worst violators, else the largest |beta|
    first = [] if v0 is None else [np.flatnonzero(v0)]
    if rec.prior == "seeded":
        lam0 = gamma if gamma is not None else 0.0
        viol = np.flatnonzero((np.abs(r_ref) > lam0 + scale) & (v0 == 0))
        first.append(viol[np.argsort(-np.abs(r_ref[viol]), kind="stable")][:max(shard.min_growth,
                                                                                  first[0].size)])
    else:
        first.append(np.argsort(-np.abs(beta_u), kind="stable")[:min(shard.start, max(1, cap // 2))])
    W = _unique_first(np.concatenate(first).astype(np.intp))[:cap]
    buf = np.empty((cap, op.p))  # G_W's rows; pages are touched only as W grows
    m, iters = 0, 0
    inside = np.zeros(op.n, dtype=bool)
    while True:
        new = W[m:]
        if new.size:  # read the new rows, sorted for the shards, placed in W's order
            order = np.argsort(new, kind="stable")
            buf[m + order] = op.rows(new[order])
            buf[m:m + new.size] *= t[new][:, None]
            rec.rows_read += int(new.size)
            inside[new] = True
            m = W.size
            rec.held_rows = max(rec.held_rows, m)
        GW = buf[:m]
        sub = solve_kmm_gradients(GW, g, gamma=gamma, budget=budget, tol=tol, policy=policy)
        iters += int(sub.iterations or 0)
        lam = float(sub.info["multiplier"])
        vW = sub.w
        u = vW @ GW
        r_W = GW @ u - beta_u[W]
        v = np.zeros(op.n)
        v[W] = vW
        # outside W: certified by the bound from the last known residuals, else read
        drift = np.array([np.linalg.norm(u - ur) for ur in u_refs])
        bound = np.abs(r_ref) + np.sqrt(diag_u) * drift[ref]
        uncertain = np.flatnonzero(~inside & (bound > lam + scale))
        u_refs.append(u)
        now, how = len(u_refs) - 1, "bound"
        far = uncertain.size if op.near is None else int(np.count_nonzero(~op.near[uncertain]))
        if uncertain.size and far <= shard.read_rows_share * op.n and \
                8 * op.p * (m + min(uncertain.size, _READ)) <= shard.max_gather_bytes:
            how = "rows"
            for lo in range(0, uncertain.size, _READ):  # a few thousand rows at a time beside G_W
                idx = uncertain[lo:lo + _READ]
                r_ref[idx] = t[idx] * (op.rows(idx) @ u) - beta_u[idx]
            ref[uncertain] = now
            rec.rows_read += int(uncertain.size)
        elif uncertain.size:
            how = "pass"
            r_ref = t * op.times(u) - beta_u
            u_refs, ref, now = [u], np.zeros(op.n, dtype=np.intp), 0
            rec.passes += 1
            bound = np.abs(r_ref)
        r_ref[W], ref[W] = r_W, now  # W's own residuals are exact at u
        exact_out = np.zeros(op.n, dtype=bool)
        exact_out[uncertain] = True
        viol = uncertain[np.abs(r_ref[uncertain]) > lam + scale]
        rec.rounds.append({"size": int(m), "nonzeros": int(np.count_nonzero(vW)), "checked": how,
                           "uncertain": int(uncertain.size), "violators": int(viol.size),
                           "step": sub.info.get("step"), "iterations": int(sub.iterations or 0)})
        if viol.size == 0:
            # the certificate: exact residuals on W and on the rows read; the bound for the rest of the candidates
            out_kkt = np.where(exact_out, np.abs(r_ref), bound)
            out_kkt[W] = 0.0
            kkt = max(kkt_from(vW, r_W, lam), float(np.max(out_kkt - lam, initial=0.0)))
            r_known = np.zeros(op.n)
            r_known[W] = r_W  # the objective needs r on the support only
            return done(v, r_known, kkt, lam, iters, {"converged": True, "working_set": int(m),
                                                      "sub_step": sub.info.get("step")}, r_ref, ref, u_refs, W)
        grow = min(viol.size, max(shard.min_growth, int(shard.growth * m)))
        if cap - m < grow:  # full: W's zeros well inside (|r_i| < prune_below lambda) leave it first
            keep = np.flatnonzero((vW != 0) | (np.abs(r_W) >= shard.prune_below * lam))
            if keep.size < m:
                for j, i in enumerate(keep):  # rows move forward only: in place, no second copy of G_W
                    if i != j:
                        buf[j] = buf[i]
                inside[W] = False
                W, m = W[keep], keep.size
                inside[W] = True
                rec.rounds[-1]["pruned_to"] = int(m)
        room = cap - m
        if room <= 0:
            raise KMMSolveError(f"sharded gradient-space solve: {viol.size} candidates violate KKT outside a working "
                                f"set of {m} rows, the most ShardPolicy.max_gather_bytes = {shard.max_gather_bytes} "
                                f"allows at p = {op.p}; raise it")
        worst = viol[np.argsort(-np.abs(r_ref[viol]), kind="stable")][:min(grow, room)]
        W = np.concatenate([W, worst])


def _unique_first(a: np.ndarray) -> np.ndarray:
    """a's distinct entries in the order they first appear."""
    _, first = np.unique(a, return_index=True)
    return a[np.sort(first)]


class _Unreached(Exception):
    """A product the shards would have had to compute."""


def _unreached(_: np.ndarray) -> np.ndarray:
    raise _Unreached


def answer_without_shards(n: int, p: int, beta: np.ndarray, diag: np.ndarray, g_tar: np.ndarray, *,
                          prior: Prior | None, **options) -> KMMSolution | None:
    """solve_sharded's answer where it reads no shard: a prior that still certifies, or w = 0 at gamma >= gamma_max;
    None where the solve needs products (options: those of solve_sharded)."""
    op = ShardedGradients(n=n, p=p, beta=beta, diag=diag, times=_unreached, rows=_unreached)
    try:
        return solve_sharded(op, g_tar, prior=prior, **options)
    except _Unreached:
        return None
