"""The reduced-Gram working set for dense solutions of many candidates in the gradient form (N > p).

A working set W of candidates, grown by the worst KKT violators outside it, is solved exactly on K_WW = G_W G_W^T
alone: K_WW is kept in float32 and grown by appending the new candidates' rows (never K itself: N^2), ADMM factors
K_WW + rho I once and extends that Cholesky factor as W grows (never refactoring for the same rho), and every float64
product (the polish's refinement, the residual, the certificate) reads the rows of G it needs, a block at a time.
The answer on W is ADMM's polished, exact support solve; it is the answer for all candidates once no candidate
outside W has |r_i| > gamma, which one float64 pass over G checks. Each round warm-starts ADMM from the last one's
answer and its residual (the scaled dual u = -r / rho), so later rounds take a few steps each.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import scipy.linalg as sla

from convalue.solvers import admm
from convalue.solvers.active_set import kkt_from, past_deadline
from convalue.solvers.linalg import cholesky_solve, mixed_precision_solve, self_gram, solve_dense
from convalue.solvers.policy import LinalgPolicy, SolverPolicy

#: rows of G read at a time by the blocked products (a 1024 x p float64 block: 64 MiB at p = 8192)
_BLOCK = 1024


class RowReader:
    """Products with rows of G read a block of rows at a time, through two buffers made once (a block: 64 MiB in
    float64 at p = 8192): a fresh temporary that large is mapped, faulted in and unmapped on every block."""

    def __init__(self, G: np.ndarray):
        self.G = G
        self._buf64: np.ndarray | None = None
        self._buf32: np.ndarray | None = None

    def block(self, rows: np.ndarray) -> np.ndarray:
        """G[rows] (at most _BLOCK rows) in the float64 buffer (a view, valid until the next call)."""
        if self._buf64 is None:
            self._buf64 = np.empty((_BLOCK, self.G.shape[1]))
        return np.take(self.G, rows, axis=0, out=self._buf64[:rows.size], mode="clip")  # "raise" buffers out

    def block32(self, rows: np.ndarray) -> np.ndarray:
        """G[rows] cast to float32, in the float32 buffer (a view, valid until the next call)."""
        if self._buf32 is None:
            self._buf32 = np.empty((_BLOCK, self.G.shape[1]), dtype=np.float32)
        out = self._buf32[:rows.size]
        np.copyto(out, self.block(rows), casting="same_kind")
        return out

    def rows_times(self, rows: np.ndarray, x: np.ndarray) -> np.ndarray:
        """x @ G[rows] (a length-p vector), with no |rows| x p copy."""
        out = np.zeros(self.G.shape[1])
        for lo in range(0, rows.size, _BLOCK):
            out += x[lo:lo + _BLOCK] @ self.block(rows[lo:lo + _BLOCK])
        return out

    def times_rows(self, rows: np.ndarray, v: np.ndarray) -> np.ndarray:
        """G[rows] @ v."""
        out = np.empty(rows.size)
        for lo in range(0, rows.size, _BLOCK):
            out[lo:lo + _BLOCK] = self.block(rows[lo:lo + _BLOCK]) @ v
        return out

    def gram32(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """G[a] G[b]^T in float32 (the products in float32, half the time of float64), a of at most _BLOCK rows."""
        Ga = self.block32(a).copy()
        out = np.empty((a.size, b.size), dtype=np.float32)
        for lo in range(0, b.size, _BLOCK):
            out[:, lo:lo + _BLOCK] = Ga @ self.block32(b[lo:lo + _BLOCK]).T
        return out


class ReducedGram:
    """The operator of the candidates W (in the order they joined) of a gradient-form problem, for ADMM + polish and
    PDAS (n, beta, diag, rank_bound, apply, sub, solve_support, solve_support_residual, shifted_solver).

    One float32 m x m buffer (Fortran order, m = |W|) holds two matrices: K_WW strictly above its diagonal, and the
    lower Cholesky factor L of K_WW + rho I on and below it (K_ii is diag, in float64). LAPACK reads one triangle of
    each, so the pair costs 4 m^2 bytes instead of 8. grow() appends candidates: their rows of K (float32 products
    of W's rows of G, kept in float32) and, where a factor exists, its new rows (L21 = K21 L11^-T,
    L22 = chol(K22 + rho I - L21 L21^T)): no refactorisation while rho stays. Every float64 product reads G."""

    def __init__(self, G: np.ndarray, beta: np.ndarray, diag: np.ndarray, *, linalg: LinalgPolicy,
                 max_size: int | None = None, gather_max_bytes: int = 1 << 28):
        self.G, self.full_beta, self.full_diag, self.linalg = G, beta, diag, linalg
        self.rows = RowReader(G)
        self.gather_max_bytes = gather_max_bytes
        cap = G.shape[0] if max_size is None else min(G.shape[0], max_size)  # the most candidates W will hold
        # the buffer's memory, for its largest size: np.empty maps it without touching it, so only the m^2 entries
        # in use are resident, and growing it moves columns in place (no second buffer at any time)
        self._raw = np.empty(cap * cap, dtype=np.float32)
        self.W = np.empty(0, dtype=np.intp)
        self.rho: float | None = None  # the shift of the factor in buf's lower triangle (None: no factor yet)
        self.factored_rows = 0  # rows factored, all factors together (for the record)
        self.beta = np.empty(0)
        self.diag = np.empty(0)

    @property
    def n(self) -> int:
        return int(self.W.size)

    @property
    def rank_bound(self) -> int:
        return min(self.n, self.G.shape[1])

    @property
    def buf(self) -> np.ndarray:
        """The m x m Fortran-order buffer (a view of the first m^2 entries)."""
        m = self.n
        return self._raw[:m * m].reshape((m, m), order="F")

    def grow(self, new: np.ndarray) -> None:
        """Append the candidates `new` (none of them in W) to W: their rows of K_WW and of the factor, a block of
        candidates at a time (the temporaries stay a block's rows)."""
        new = np.asarray(new, dtype=np.intp)
        for lo in range(0, new.size, _BLOCK):
            self._append(new[lo:lo + _BLOCK])

    def _append(self, new: np.ndarray) -> None:
        m, k = self.n, new.size
        M = m + k
        if M * M > self._raw.size:
            raise ValueError(f"the working set would exceed its {int(np.sqrt(self._raw.size))} candidates")
        W = np.concatenate([self.W, new])
        rows = self.rows.gram32(new, W)  # K[new, W] in float32
        diag = self.full_diag[new].astype(np.float32)
        l21 = l22 = None
        if self.rho is not None:
            old = self.buf
            l21 = np.array(rows[:, :m], order="F")  # a copy even for one row (then C and F order at once)
            if m:  # L21 = K21 L11^-T (L11: the buffer's lower triangle)
                l21 = sla.blas.strsm(1.0, old, l21, side=1, lower=1, trans_a=1, overwrite_b=1)
            schur = rows[:, m:].copy()
            schur[np.diag_indices(k)] = diag + np.float32(self.rho)
            if m:
                schur -= l21 @ l21.T
            l22, info = sla.lapack.spotrf(schur.T, lower=1, clean=0, overwrite_a=1)  # symmetric: .T is Fortran
            if info != 0:
                l21 = l22 = None
                self.rho = None  # the next shifted_solver factors anew (and raises if it cannot)
        raw = self._raw
        for j in range(m - 1, 0, -1):  # column j moves from j m to j M: last first, into untouched memory
            raw[j * M:j * M + m] = raw[j * m:j * m + m]
        self.W = W
        buf = self.buf
        buf[:m, m:] = rows[:, :m].T  # K_12 above the diagonal
        buf[m:, m:] = rows[:, m:]  # K_22: its upper triangle stays, the lower is the factor's (below)
        if l22 is not None:
            buf[m:, :m] = l21
            for j in range(k):
                buf[m + j:, m + j] = l22[j:, j]
            self.factored_rows += k
        self.beta, self.diag = self.full_beta[W], self.full_diag[W]

    def keep(self, positions: np.ndarray) -> None:
        """Keep only the candidates at these positions of W (sorted): K's rows and columns are compacted in place,
        the factor is dropped (the next shifted_solver factors anew)."""
        positions = np.asarray(positions, dtype=np.intp)
        m, M = self.n, positions.size
        raw = self._raw
        for jn, j in enumerate(positions):  # column j of m rows becomes column jn of M: never ahead of its source
            raw[jn * M:jn * M + M] = raw[j * m:j * m + m][positions]
        self.W = self.W[positions]
        self.rho = None
        self.beta, self.diag = self.full_beta[self.W], self.full_diag[self.W]

    def gram32(self, A: np.ndarray) -> np.ndarray:
        """K_AA in float32 (A sorted), a new C-order array whose upper triangle and diagonal are K's (its lower
        triangle holds factor entries: LAPACK reads the upper one, as Kaa32.T's lower)."""
        Kaa = self.buf[np.ix_(A, A)]
        Kaa[np.diag_indices(A.size)] = self.diag[A]
        return np.ascontiguousarray(Kaa)

    # the operator protocol, on W
    def apply(self, A: np.ndarray, x: np.ndarray) -> np.ndarray:
        """K_WA x in float64: G_W (G_A^T x)."""
        if A.size == 0:
            return np.zeros(self.n)
        return self.rows.times_rows(self.W, self.rows.rows_times(self.W[A], x))

    def sub(self, A: np.ndarray) -> np.ndarray:
        """K_AA in float64 (|A|^2 p flops)."""
        return self_gram(self.G[self.W[A]])

    def solve_support(self, A: np.ndarray, rhs: np.ndarray) -> np.ndarray:
        """x with K_AA x = rhs: K_AA gathered from the float32 buffer, factored in float32 and refined with float64
        products G_A (G_A^T x); the float64 K_AA and its factor where float32 cannot get there."""
        order = np.argsort(A, kind="stable")
        if rhs.ndim == 1 and np.array_equal(order, np.arange(A.size)):
            rows = self.W[A]
            if rows.size * self.G.shape[1] * 8 <= self.gather_max_bytes:
                GA = self.G[rows]  # read once for the refinement's float64 products G_A (G_A^T x)

                def matvec(v):
                    return GA @ (v @ GA)
            else:  # a block of G's rows at a time: no |A| x p copy

                def matvec(v):
                    return self.rows.times_rows(rows, self.rows.rows_times(rows, v))
            x = mixed_precision_solve(self.gram32(A), rhs, matvec)
            if x is not None:
                return x
        return solve_dense(self.sub(A), rhs, mixed_min_n=None)

    def solve_support_residual(self, A: np.ndarray, rhs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(x, r): x with K_AA x = rhs and r = K w - beta on W for w = x on A."""
        x = self.solve_support(A, rhs)
        return x, self.apply(A, x) - self.beta

    def shifted_solver(self, rho: float, **_) -> Callable[[np.ndarray], np.ndarray]:
        """b -> (K_WW + rho I)^-1 b from the buffer's float32 factor: the one grow() kept extending where rho is the
        same, else factored anew (K from the buffer's upper triangle)."""
        m = self.n
        buf = self.buf
        if self.rho != rho:
            # in place: K's upper triangle mirrored into the lower one, the shift on the diagonal, then spotrf, which
            # writes the lower triangle only (K above it stays): no second m x m array
            self.rho = None
            for j in range(m):
                buf[j + 1:, j] = buf[j, j + 1:]
            buf[np.diag_indices(m)] = self.diag.astype(np.float32) + np.float32(rho)
            c, info = sla.lapack.spotrf(buf, lower=1, clean=0, overwrite_a=1)
            if info != 0:
                raise np.linalg.LinAlgError(f"K_WW + rho I is not positive definite (LAPACK spotrf info={info})")
            if not np.shares_memory(c, buf):  # f2py factors in place on a Fortran float32 array; never copies here
                raise AssertionError("spotrf copied the buffer")
            self.rho = rho
            self.factored_rows += m
        c = buf

        def solve(b: np.ndarray) -> np.ndarray:
            return cholesky_solve(c, b)  # trtrs reads the lower triangle only

        solve.lambda_min_bound = float(np.min(np.diag(c)).astype(np.float64) ** 2) - rho
        return solve


def _admm_rounds(solve, beta: np.ndarray, gamma: float, rho: float, z: np.ndarray, u: np.ndarray, max_steps: int,
                 settle: int, alpha: float = 1.6) -> tuple[np.ndarray, np.ndarray, int]:
    """ADMM's steps alone (admm.admm_polish's, with no polish): (z, u, steps) once the signs have held `settle` steps,
    or after max_steps. A round that only chooses the next violators needs the support, not an exact point."""
    pattern, stable = b"", 0
    for it in range(1, max_steps + 1):
        w = solve(beta + rho * (z - u))
        x = alpha * w + (1 - alpha) * z + u
        u = np.clip(x, -gamma / rho, gamma / rho)
        z = x - u
        signs = np.sign(z).astype(np.int8).tobytes()
        stable = stable + 1 if signs == pattern else 0
        pattern = signs
        if stable >= settle:
            return z, u, it
    return z, u, max_steps


def reduced_working_set(G: np.ndarray, beta: np.ndarray, diag: np.ndarray, gamma: float, scale: float,
                        deadline: float | None = None, *, policy: SolverPolicy,
                        record: dict | None = None) -> tuple[np.ndarray, int, bool]:
    """The penalised problem on all N candidates through working sets W solved on K_WW (the module's docstring);
    (w, ADMM steps, certified).

    While many candidates violate, a round is ADMM's steps alone on W, warm-started, until the signs settle: its
    residual chooses the next violators, and no support is factored. Once the iterate leaves at most the policy's
    reduced.polish_violators outside W, ADMM + polish (convalue.solvers.admm) solves W exactly, and one float64 pass
    checks every candidate. Where W would outgrow reduced.max_size, its zeros with |r_i| below reduced.prune_below
    gamma leave it first. It gives up (uncertified, the closest iterate) where W is full of candidates that stay, where
    ADMM + polish does not certify on W, or at the deadline. record (a dict) receives the rounds."""
    rp = policy.reduced
    n = G.shape[0]
    op = ReducedGram(G, beta, diag, linalg=policy.linalg, max_size=rp.max_size, gather_max_bytes=rp.gather_max_bytes)
    gmax = float(np.abs(beta).max())
    cap = min(n, rp.max_size)
    op.grow(np.sort(np.argsort(-np.abs(beta), kind="stable")[:min(cap, rp.start)]))
    rho_rel = admm.admm_rho(gamma, gmax, policy.admm)
    w, steps, rounds, ok = np.zeros(n), 0, [], False
    z, u = np.zeros(op.n), np.zeros(op.n)
    exact = False  # whether the last round polished W exactly
    while not past_deadline(deadline):
        rho = rho_rel * float(np.mean(op.diag))
        if exact or len(rounds) and rounds[-1]["violators"] <= rp.polish_violators:
            z, it, ok, _ = admm.admm_polish(op, gamma, z, scale, policy=policy, rho=rho_rel,
                                            max_iter=policy.admm.max_iter, deadline=deadline, u0=u)
            exact = True
            if not ok:
                steps += it
                break
        else:
            z, u, it = _admm_rounds(op.shifted_solver(rho), op.beta, gamma, rho, z, u, rp.round_steps,
                                    policy.admm.settle)
        steps += it
        w = np.zeros(n)
        w[op.W] = z
        A = np.flatnonzero(w)
        r = G @ op.rows.rows_times(A, w[A]) - beta  # the float64 residual of all N: one pass over G
        outside = np.ones(n, dtype=bool)
        outside[op.W] = False
        violators = np.flatnonzero(outside & (np.abs(r) > gamma + scale))
        rounds.append({"size": op.n, "nonzeros": int(A.size), "steps": it, "exact": exact,
                       "violators": int(violators.size)})
        if exact and violators.size == 0:
            ok = kkt_from(w, r, gamma) <= scale
            break
        if violators.size == 0:  # after an inexact round nothing outside W violates: W's exact solve decides
            exact = True
            u = _dual(r[op.W], gamma, rho)
            continue
        grow = min(violators.size, max(rp.min_growth, int(rp.growth * op.n)))
        if cap - op.n < grow:
            # full: drop W's zeros that lie well inside (|r_i| < prune_below gamma), then factor anew
            rw = np.abs(r[op.W])
            kept = np.flatnonzero((z != 0) | (rw >= rp.prune_below * gamma))
            if kept.size < op.n:
                op.keep(kept)
                z, rounds[-1]["pruned_to"] = z[kept], int(kept.size)
        room = cap - op.n
        if room <= 0:
            break
        worst = violators[np.argsort(-np.abs(r[violators]), kind="stable")]
        op.grow(worst[:min(room, grow)])
        z = w[op.W]
        u = _dual(r[op.W], gamma, rho)  # the warm start's scaled dual: u = -r / rho at ADMM's fixed point
        exact = False
    if record is not None:
        record |= {"rounds": rounds, "factored_rows": op.factored_rows}
    return w, steps, ok


def _dual(r: np.ndarray, gamma: float, rho: float) -> np.ndarray:
    """ADMM's scaled dual at the fixed point of a residual r: -r / rho, clipped to +-gamma / rho."""
    return np.clip(-r / rho, -gamma / rho, gamma / rho)
