"""The LARS homotopy on a working set of candidates grown by KKT violators: exact, with small systems."""

from __future__ import annotations

import numpy as np

from solvers.active_set import past_deadline, pdas_plain, residual
from solvers.homotopy import distinct, expand, lars
from solvers.operators import GramOperator

#: the working-set homotopy's first set (the largest |beta|) and its largest set (LARS costs about |W|^3 on it).
#: bench/sparse_chain.py --starts 64 128 256 (24 cases): geometric means 67, 49 and 45 ms; 128 and 256 each
#: fastest in 12 cases, 64 in none (it needs more rounds)
WORKING_SET_START = 128
WORKING_SET_MAX = 1024


def working_set_homotopy(op, gamma: float, scale: float, deadline: float | None = None, *,
                         start: int | None = None, max_size: int | None = None) -> tuple[np.ndarray, int, bool]:
    """The homotopy on a working set W grown by the candidates that violate KKT outside it; (w, steps, converged).

    For sparse solutions where PDAS's supports can exceed the rank (N > p), so that plain PDAS stops at once and
    continuation jumps to such supports at every stage, and for the gradient form, where a support of s costs
    s^2 p to form: LARS on the few candidates of W (one of each duplicate group) is exact, and w is optimal
    once no candidate outside W has |r_i| > gamma. Each round adds the worst violators,
    at most doubling W; past WORKING_SET_MAX candidates it gives up and the chain goes on. start: the size of the
    first W (WORKING_SET_START when None, read at call time like WORKING_SET_MAX); max_size: the largest W
    (WORKING_SET_MAX when None).
    """
    n = op.n
    start = WORKING_SET_START if start is None else start
    cap = min(n, WORKING_SET_MAX if max_size is None else max_size)
    W = np.sort(np.argsort(-np.abs(op.beta), kind="stable")[:min(cap, start)])
    w, steps = np.zeros(n), 0
    while not past_deadline(deadline):
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
            wp, k, ok = pdas_plain(op, gamma, w, 2, scale, r=r)
            return wp, steps + k, ok
        room = cap - W.size
        if room <= 0:
            break
        worst = violators[np.argsort(-np.abs(r[violators]), kind="stable")]
        W = np.union1d(W, worst[:min(room, max(W.size, 32))])
    return w, steps, False
