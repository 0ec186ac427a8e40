"""The LARS homotopy on a working set of candidates grown by KKT violators: exact, with small systems (penalised and
budget forms)."""

from __future__ import annotations

import numpy as np

from convalue.solvers.active_set import past_deadline, pdas_plain, residual
from convalue.solvers.homotopy import budget_on_path, distinct, expand, lars
from convalue.solvers.operators import GramOperator
from convalue.solvers.policy import SolverPolicy


def working_set_homotopy(op, gamma: float, scale: float, deadline: float | None = None, *, policy: SolverPolicy,
                         start: int | None = None, max_size: int | None = None,
                         seed: np.ndarray | None = None) -> tuple[np.ndarray, int, bool]:
    """The homotopy on a working set W grown by the candidates that violate KKT outside it; (w, steps, converged).

    For sparse solutions where PDAS's supports can exceed the rank (N > p), so that plain PDAS stops at once and
    continuation jumps to such supports at every stage, and for the gradient form, where a support of s costs
    s^2 p to form: LARS on the few candidates of W (one of each duplicate group) is exact, and w is optimal
    once no candidate outside W has |r_i| > gamma. Each round adds the worst violators,
    at most doubling W; past max_size candidates it gives up and the chain goes on. start: the size of the
    first W (the policy's working_set.start when None); max_size: the largest W (working_set.max_size when None);
    seed: an iterate whose nonzeros (the largest |w| first) join the first W, up to max_size.
    """
    def at_gamma(sub) -> tuple[float, np.ndarray, int, bool]:
        _, path, k = lars(sub, gamma, return_path=False)
        return gamma, path[-1], k, True

    w, _, steps, ok = _grown(op, at_gamma, scale, deadline, policy, start, max_size, seed=seed)
    return w, steps, ok


def working_set_budget(op, budget: float, scale: float, *, policy: SolverPolicy, start: int | None = None,
                       max_size: int | None = None,
                       max_active: int | None = None) -> tuple[np.ndarray, float, int, bool]:
    """The budget form (||w||_1 <= budget) on a working set grown like working_set_homotopy's; (w, gamma, steps,
    converged), gamma the budget's multiplier.

    On W the homotopy's path is followed down to a stopping gamma: where its l1 reaches the budget there, the point
    and its gamma are exact (w and ||w||_1 are affine between breakpoints), and w is optimal for all candidates once
    none outside W has |r_i| > gamma. Where it falls short, W grows by the violators at the stopping gamma, or, with
    none (W's point is then the full path's), the stopping gamma halves; LARS's cost grows with the path's length, so
    no path is followed much further than the budget needs. It gives up where the budget does not bind on W's whole
    path and nothing violates at its end (the gamma grid decides that case), past max_size candidates, or where W's
    path, short of the budget, heads for more than max_active (the policy's working_set.max_size when None) active
    candidates, read as its active count times budget / l1: LARS's steps cost about |W| times the active count
    each, so a dense budget costs it more than the grid.
    """
    gmax = float(np.abs(op.beta).max())
    floor = gmax * 1e-12
    stop, ended = 0.25 * gmax, False
    most = policy.working_set.max_size if max_active is None else max_active

    def at_budget(sub) -> tuple[float, np.ndarray, int, bool] | None:
        nonlocal ended
        gammas, path, k = lars(sub, stop, return_path=True)
        found = budget_on_path(gammas, path, budget)
        if found is not None:
            return *found, k, True
        if np.count_nonzero(path[-1]) * budget > most * np.abs(path[-1]).sum():
            return None
        # W's path went to its end below the stopping gamma (all of W active): no deeper. LARS can also stop a hair
        # above it (by round-off in its last step), where going deeper still helps
        ended = bool(gammas[-1] < stop)
        return float(gammas[-1]), path[-1], k, False

    def deeper() -> bool:
        nonlocal stop
        if stop <= floor or ended:
            return False
        stop = max(0.5 * stop, floor)
        return True

    return _grown(op, at_budget, scale, None, policy, start, max_size, deeper)


def _grown(op, solve_on, scale: float, deadline: float | None, policy: SolverPolicy, start: int | None,
           max_size: int | None, deeper=None, seed: np.ndarray | None = None) -> tuple[np.ndarray, float, int, bool]:
    """(w, gamma, steps, converged) on a working set W of the largest |beta| (and seed's nonzeros) grown by the worst
    KKT violators outside it until none is left. solve_on(the Gram operator of W) -> (gamma, w on W, steps, final), or
    None to give up: a point with final False and no violators is not the form's answer yet: deeper() (None: never)
    moves solve_on on, False if it cannot."""
    n = op.n
    start = policy.working_set.start if start is None else start
    cap = min(n, policy.working_set.max_size if max_size is None else max_size)
    ranked = np.argsort(-np.abs(op.beta), kind="stable")[:min(cap, start)]
    if seed is not None:  # seed's nonzeros go first, then the largest |beta|, each candidate once
        on = np.flatnonzero(seed)
        ranked = np.concatenate([on[np.argsort(-np.abs(seed[on]), kind="stable")], ranked])
        _, first = np.unique(ranked, return_index=True)
        ranked = ranked[np.sort(first)]
    W = np.sort(ranked[:cap])
    w, steps, gamma, sub = np.zeros(n), 0, float("nan"), None
    while not past_deadline(deadline):
        if sub is None:
            # the Gram form of W for both operators (scikit-learn's LARS on the gradients stops early on small
            # residues), one candidate of each duplicate group (LARS ends at a wrong point on exact ties)
            sub, keep = distinct(GramOperator(op.sub(W), op.beta[W], linalg=op.linalg), policy.homotopy.max_pairs)
        found = solve_on(sub)
        if found is None:
            break
        gamma, v, k, final = found
        steps += k
        w = np.zeros(n)
        w[W] = expand(v, keep, W.size)
        r = residual(op, w)
        violates = np.abs(r) > gamma + scale
        violates[W] = False  # only candidates outside W can grow it
        violators = np.flatnonzero(violates)
        if violators.size == 0 and final:  # w itself when it certifies, else two PDAS steps (round-off in LARS)
            wp, k, ok = pdas_plain(op, gamma, w, 2, scale, r=r)
            return wp, gamma, steps + k, ok
        if violators.size == 0:
            if deeper is None or not deeper():
                break
            continue
        room = cap - W.size
        if room <= 0:
            break
        worst = violators[np.argsort(-np.abs(r[violators]), kind="stable")]
        W = np.union1d(W, worst[:min(room, max(W.size, 32))])
        sub = None
    return w, gamma, steps, False
