"""The order of strategies as data: pure functions from a problem's facts and the policy to the steps to try.

solve_penalised and solve_budget compute the facts, ask for the plan and run its steps in order until one certifies.
Two steps decide at run time whether they apply, on what an earlier step found (each says so below); every other
step runs when its turn comes. docs/solver.md shows the plan as a table.
"""

from __future__ import annotations

from dataclasses import dataclass

from convalue.solvers.policy import SolverPolicy

ZERO = "zero"  # gamma >= max|beta|: w = 0 is optimal
HOMOTOPY = "homotopy"  # the full LARS homotopy on the problem as given (the entry points deduplicated it)
WORKING_SET = "working_set"  # the working-set homotopy, from the policy's first set up to its cap
PROBE = "probe"  # the working-set homotopy from a few candidates up to a small cap (cheap where it gives up)
WARM_PDAS = "warm_pdas"  # PDAS from the warm start, then orthant-projected Newton
PDAS_DIRECT = "pdas_direct"  # plain PDAS from zero straight at gamma
PDAS_CONTINUATION = "pdas_continuation"  # PDAS down a gamma grid from max|beta|
#: a working set grown by KKT violators, solved on its reduced Gram K_WW (float32, appended) by warm-started ADMM
#: steps, then ADMM + polish: the gradient form's dense solutions of many candidates (convalue.solvers.reduced)
REDUCED = "reduced_working_set"
ADMM_FIRST = "admm_first"  # ADMM's first rho for the policy's first steps only
SEEDED_WIDE = "seeded_wide_working_set"  # the working set up to the wide cap, seeded by ADMM's first iterate
WIDE = "wide_working_set"  # the same, unseeded (the gradient form, or seeding off)
#: the full homotopy on distinct candidates, run only where ADMM's first iterate has at least the wide cap's count of
#: nonzeros (the seeded working set would start full, with no room to grow); declines otherwise (decided at run time)
FALLBACK_HOMOTOPY_IF_SEED_FULL = "fallback_homotopy_if_seed_full"
#: the same where the step above declined; declines where it ran (decided at run time)
FALLBACK_HOMOTOPY_UNLESS_SEED_FULL = "fallback_homotopy_unless_seed_full"
FALLBACK_HOMOTOPY = "fallback_homotopy"  # the full homotopy on distinct candidates, unconditionally
ADMM = "admm"  # ADMM + polish in full: its first rho, then the policy's retries
# the fallbacks, from the closest iterate any step above reached
NNLS_POLISH = "nnls_polish"  # NNLS on the equicorrelation set
CVXPY_REFERENCE = "cvxpy_reference"  # the reference library, then the NNLS polish
COORDINATE_DESCENT = "coordinate_descent"  # cyclic coordinate descent, then the NNLS polish
FALLBACKS = (NNLS_POLISH, CVXPY_REFERENCE, COORDINATE_DESCENT)
GAMMA_GRID = "gamma_grid"  # the budget form's bracketing gamma grid of penalised solves (always answers)


@dataclass(frozen=True)
class PenalisedFacts:
    """What the penalised form's plan depends on: sizes, the form, gamma against max|beta|, a warm start."""

    n: int  # candidates N
    rank: int  # an upper bound on rank(K): N when unknown, min(N, p) in the gradient form
    gram: bool  # K is formed (False: the gradient form, G only)
    gamma: float
    beta_max: float  # max|beta|
    warm_start: bool = False  # a starting w (the budget form's grid, kmm_path)


@dataclass(frozen=True)
class BudgetFacts:
    """What the budget form's plan depends on."""

    n: int
    rank: int


def homotopy_work(n: int, rank: int) -> float:
    """The homotopy's cost measure N rank^2."""
    return n * float(rank) ** 2


def affordable(n: int, rank: int, policy: SolverPolicy) -> bool:
    """True for a rank-deficient problem (rank < N) small enough for the full homotopy."""
    return rank < n and homotopy_work(n, rank) <= policy.homotopy.max_work


def forms_gram(facts: PenalisedFacts, policy: SolverPolicy) -> bool:
    """True where a gradient-form problem is solved on K = G G^T formed once: N <= p (K no larger than G; there
    rank = N) at a dense gamma, where ADMM would factor a p x p matrix and every support system be a product."""
    return (not facts.gram and facts.rank >= facts.n
            and facts.gamma < policy.plan.dense_ratio * facts.beta_max)


def reduces(facts: PenalisedFacts, policy: SolverPolicy) -> bool:
    """True where the dense head tries the reduced-Gram working set: the gradient form with N > p (K would be larger
    than G, and ADMM's p x p factor and its products over all of G are the cost) of at least reduced.min_n
    candidates."""
    r = policy.reduced
    return not facts.gram and facts.rank < facts.n and r.min_n > 0 and facts.n >= r.min_n


def seed_fills_wide(nonzeros: int, policy: SolverPolicy) -> bool:
    """The run-time test of the two conditional homotopy steps: ADMM's first iterate has as many nonzeros as the
    wide working set's cap, so that a working set seeded by it would start full."""
    return nonzeros >= policy.plan.wide_max


def _admm_steps(facts: PenalisedFacts, policy: SolverPolicy, deficient: bool, easy: bool) -> list[str]:
    """ADMM's part of a dense start: its first steps, the wide working set (and the fallback homotopy), ADMM in full."""
    p = policy.plan
    if p.admm_first_steps <= 0:
        return [ADMM]
    wide = SEEDED_WIDE if p.wide_seeded and facts.gram else WIDE
    # past the homotopy's usual limit but within the fallback's, the full homotopy follows the wide working set,
    # or goes before it where ADMM's iterate would fill a seeded one (in the gradient form too, where the working
    # set is not seeded: that order is the faster one there as well)
    if easy or not deficient or homotopy_work(facts.n, facts.rank) > p.homotopy_fallback_work:
        return [ADMM_FIRST, wide, ADMM]
    if p.wide_seeded:
        return [ADMM_FIRST, FALLBACK_HOMOTOPY_IF_SEED_FULL, wide, FALLBACK_HOMOTOPY_UNLESS_SEED_FULL, ADMM]
    return [ADMM_FIRST, wide, FALLBACK_HOMOTOPY, ADMM]


def plan_penalised(facts: PenalisedFacts, policy: SolverPolicy) -> tuple[str, ...]:
    """The steps solve_penalised tries, in order, until one certifies; then the fallbacks (FALLBACKS), in order."""
    p = policy.plan
    if facts.gamma >= facts.beta_max:
        return (ZERO,)
    deficient = facts.rank < facts.n  # supports larger than the rank are singular
    easy = affordable(facts.n, facts.rank, policy)
    can_admm = facts.n <= p.admm_max_n or not facts.gram
    sparse = facts.gamma >= p.dense_ratio * facts.beta_max
    # where supports can outgrow the rank, or cost s^2 p to form, the working set's small systems go first
    grown_first = deficient or not facts.gram
    # a cold dense start: a gamma dense by its ratio can have a sparse solution, which the capped probe finds cheaply
    probing = p.probe_max > 0 and (deficient or facts.n >= p.probe_min_n)
    dense_head = (([PROBE] if probing else []) + ([REDUCED] if reduces(facts, policy) else [])
                  + (_admm_steps(facts, policy, deficient, easy) if can_admm else []))
    if easy:
        # PDAS would jump to singular supports and ADMM crawls; the working set first for sparse solutions of many
        # candidates (LARS would copy all of K for a short path)
        first = facts.n >= p.working_set_first_min_n and facts.gamma >= p.working_set_first_ratio * facts.beta_max
        chain = [WORKING_SET, HOMOTOPY] if first else [HOMOTOPY]
    elif facts.warm_start:
        # what a cold start tries first goes before warm PDAS where supports can outgrow the rank (ADMM starts cold)
        chain = (([WORKING_SET] if sparse else dense_head) if grown_first else []) + [WARM_PDAS]
    elif sparse or not can_admm:
        # plain PDAS straight at gamma usually lands in a few Newton steps; continuation where it cycles
        chain = [WORKING_SET, PDAS_DIRECT, PDAS_CONTINUATION] if grown_first else [
            PDAS_DIRECT, PDAS_CONTINUATION, WORKING_SET]
    else:
        chain = dense_head
    # continuation and ADMM in full go last where they have not come yet
    chain += [s for s in (PDAS_CONTINUATION, ADMM) if s not in chain and (s != ADMM or can_admm)]
    fallbacks = [NNLS_POLISH] + ([CVXPY_REFERENCE] if facts.n <= p.reference_max_n else []) + [COORDINATE_DESCENT]
    return tuple(chain + fallbacks)


def plan_budget(facts: BudgetFacts, policy: SolverPolicy) -> tuple[str, ...]:
    """The steps solve_budget tries, in order: the full homotopy's breakpoints, a working set's, the gamma grid."""
    b = policy.budget
    steps = [HOMOTOPY] if affordable(facts.n, facts.rank, policy) else []
    if b.working_set_max > 0 and (facts.rank < facts.n or facts.n >= b.working_set_min_n):
        steps.append(WORKING_SET)  # the grid's warm solves are slow there
    return (*steps, GAMMA_GRID)
