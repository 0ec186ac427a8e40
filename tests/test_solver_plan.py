"""The solver's plan as a table: a problem's facts and the policy -> the order of steps (no solve needed)."""

from __future__ import annotations

import dataclasses

import pytest

from convalue.solvers import (
    DEFAULT_POLICY,
    BudgetFacts,
    PenalisedFacts,
    SolverPolicy,
    plan_budget,
    plan_penalised,
)
from convalue.solvers.plan import forms_gram, reduces, seed_fills_wide

# the fallbacks, from the closest iterate: the CVXPY reference only up to plan.reference_max_n (3000) candidates
FALLBACKS = ("nnls_polish", "cvxpy_reference", "coordinate_descent")
LARGE_FALLBACKS = ("nnls_polish", "coordinate_descent")
ADMM_HEAD = ("admm_first", "seeded_wide_working_set", "admm")  # a dense cold start where K is formed
SPARSE, DENSE = 0.05, 5e-4  # gamma / max|beta| on either side of plan.dense_ratio (0.01)


def facts(n: int, rank: int | None = None, *, ratio: float, gram: bool = True, warm: bool = False) -> PenalisedFacts:
    """The facts of N candidates of rank `rank` (N when None) at gamma = ratio max|beta| (max|beta| = 2)."""
    return PenalisedFacts(n=n, rank=n if rank is None else rank, gram=gram, gamma=2.0 * ratio, beta_max=2.0,
                          warm_start=warm)


PENALISED = [
    # (case, facts, policy changes, the expected order)
    ("gamma at max|beta|: w = 0", facts(1000, ratio=1.0), {}, ("zero",)),
    ("full rank, sparse: PDAS straight, continuation, the working set",
     facts(1000, ratio=SPARSE), {}, ("pdas_direct", "pdas_continuation", "working_set", "admm", *FALLBACKS)),
    ("full rank, dense: ADMM's first steps, the seeded wide working set, ADMM in full",
     facts(1000, ratio=DENSE), {}, (*ADMM_HEAD, "pdas_continuation", *FALLBACKS)),
    ("full rank, dense, N >= probe_min_n: the probe first",
     facts(2000, ratio=DENSE), {}, ("probe", *ADMM_HEAD, "pdas_continuation", *FALLBACKS)),
    ("full rank, dense, probe off",
     facts(2000, ratio=DENSE), {"plan": {"probe_max": 0}}, (*ADMM_HEAD, "pdas_continuation", *FALLBACKS)),
    ("full rank, dense, ADMM's first steps off: ADMM in full at once",
     facts(1000, ratio=DENSE), {"plan": {"admm_first_steps": 0}}, ("admm", "pdas_continuation", *FALLBACKS)),
    ("full rank, dense, N past admm_max_n: no ADMM, PDAS as for a sparse gamma",
     facts(25000, ratio=DENSE), {}, ("pdas_direct", "pdas_continuation", "working_set", *LARGE_FALLBACKS)),
    ("full rank, dense, N past reference_max_n: no CVXPY fallback",
     facts(4000, ratio=DENSE), {}, ("probe", *ADMM_HEAD, "pdas_continuation", *LARGE_FALLBACKS)),
    ("rank-deficient, affordable: the homotopy",
     facts(300, 100, ratio=DENSE), {}, ("homotopy", "pdas_continuation", "admm", *FALLBACKS)),
    ("rank-deficient, affordable, sparse, N >= working_set_first_min_n: the working set first",
     facts(2500, 20, ratio=0.1), {}, ("working_set", "homotopy", "pdas_continuation", "admm", *FALLBACKS)),
    ("rank-deficient, affordable, N >= working_set_first_min_n, gamma below working_set_first_ratio",
     facts(2500, 20, ratio=0.01), {}, ("homotopy", "pdas_continuation", "admm", *FALLBACKS)),
    ("rank-deficient, affordable, warm start: the homotopy all the same",
     facts(300, 100, ratio=DENSE, warm=True), {}, ("homotopy", "pdas_continuation", "admm", *FALLBACKS)),
    ("rank-deficient past max_work, sparse: the working set first",
     facts(3000, 1000, ratio=SPARSE), {}, ("working_set", "pdas_direct", "pdas_continuation", "admm", *FALLBACKS)),
    ("rank-deficient past max_work, within homotopy_fallback_work, dense: the fallback homotopy around the working "
     "set, which of the two decided at run time by ADMM's first iterate",
     facts(3000, 1000, ratio=DENSE), {},
     ("probe", "admm_first", "fallback_homotopy_if_seed_full", "seeded_wide_working_set",
      "fallback_homotopy_unless_seed_full", "admm", "pdas_continuation", *FALLBACKS)),
    ("the same in the gradient form: the wide working set is not seeded",
     facts(3000, 1000, ratio=DENSE, gram=False), {},
     ("probe", "admm_first", "fallback_homotopy_if_seed_full", "wide_working_set",
      "fallback_homotopy_unless_seed_full", "admm", "pdas_continuation", *FALLBACKS)),
    ("the same with seeding off: the fallback homotopy after the working set, unconditionally",
     facts(3000, 1000, ratio=DENSE), {"plan": {"wide_seeded": False}},
     ("probe", "admm_first", "wide_working_set", "fallback_homotopy", "admm", "pdas_continuation", *FALLBACKS)),
    ("rank-deficient past homotopy_fallback_work, dense: no fallback homotopy",
     facts(5000, 2000, ratio=DENSE), {}, ("probe", *ADMM_HEAD, "pdas_continuation", *LARGE_FALLBACKS)),
    ("rank-deficient past admm_max_n, dense: no ADMM, the working set and PDAS as for a sparse gamma",
     facts(25000, 1000, ratio=DENSE), {},
     ("working_set", "pdas_direct", "pdas_continuation", *LARGE_FALLBACKS)),
    ("gradient form, N <= p, sparse: the working set first (a support of s costs s^2 p to form)",
     facts(1000, ratio=SPARSE, gram=False), {},
     ("working_set", "pdas_direct", "pdas_continuation", "admm", *FALLBACKS)),
    ("gradient form, dense, N > p from reduced.min_n: the reduced-Gram working set after the probe, then ADMM "
     "all the same (it factors p x p)",
     facts(25000, 4096, ratio=DENSE, gram=False), {},
     ("probe", "reduced_working_set", "admm_first", "wide_working_set", "admm", "pdas_continuation",
      *LARGE_FALLBACKS)),
    ("the same with the reduced-Gram working set off", facts(25000, 4096, ratio=DENSE, gram=False),
     {"reduced": {"min_n": 0}},
     ("probe", "admm_first", "wide_working_set", "admm", "pdas_continuation", *LARGE_FALLBACKS)),
    ("gradient form, dense, N > p below reduced.min_n: no reduced-Gram working set",
     facts(4000, 2048, ratio=DENSE, gram=False), {},
     ("probe", "admm_first", "wide_working_set", "admm", "pdas_continuation", *LARGE_FALLBACKS)),
    ("gradient form, dense, N > p at reduced.min_n lowered by the policy",
     facts(4000, 2048, ratio=DENSE, gram=False), {"reduced": {"min_n": 4000}},
     ("probe", "reduced_working_set", "admm_first", "wide_working_set", "admm", "pdas_continuation",
      *LARGE_FALLBACKS)),
    ("gradient form, sparse, N > p: the working set (LARS) first, no reduced-Gram working set",
     facts(25000, 4096, ratio=SPARSE, gram=False), {},
     ("working_set", "pdas_direct", "pdas_continuation", "admm", *LARGE_FALLBACKS)),
    ("warm start, gradient form, dense, N > p: the dense head with the reduced-Gram working set before warm PDAS",
     facts(25000, 4096, ratio=DENSE, gram=False, warm=True), {},
     ("probe", "reduced_working_set", "admm_first", "wide_working_set", "admm", "warm_pdas", "pdas_continuation",
      *LARGE_FALLBACKS)),
    ("warm start, full rank: warm PDAS",
     facts(1000, ratio=DENSE, warm=True), {}, ("warm_pdas", "pdas_continuation", "admm", *FALLBACKS)),
    ("warm start, rank-deficient past max_work, sparse: the working set before warm PDAS",
     facts(3000, 1000, ratio=SPARSE, warm=True), {},
     ("working_set", "warm_pdas", "pdas_continuation", "admm", *FALLBACKS)),
    ("warm start, rank-deficient past max_work, dense: a cold dense start before warm PDAS",
     facts(3000, 1000, ratio=DENSE, warm=True), {},
     ("probe", "admm_first", "fallback_homotopy_if_seed_full", "seeded_wide_working_set",
      "fallback_homotopy_unless_seed_full", "admm", "warm_pdas", "pdas_continuation", *FALLBACKS)),
    ("warm start, gradient form, sparse: the working set before warm PDAS",
     facts(1000, ratio=SPARSE, gram=False, warm=True), {},
     ("working_set", "warm_pdas", "pdas_continuation", "admm", *FALLBACKS)),
]


@pytest.mark.parametrize(("case", "given", "changes", "expected"), PENALISED, ids=[row[0] for row in PENALISED])
def test_penalised_plan(case, given, changes, expected):
    assert plan_penalised(given, DEFAULT_POLICY.but(**changes)) == expected


BUDGET = [
    ("rank-deficient, affordable: the homotopy's breakpoints, a working set's, the grid",
     BudgetFacts(n=300, rank=100), {}, ("homotopy", "working_set", "gamma_grid")),
    ("rank-deficient past max_work: a working set, the grid", BudgetFacts(n=3000, rank=1000), {},
     ("working_set", "gamma_grid")),
    ("full rank, N >= working_set_min_n", BudgetFacts(n=2000, rank=2000), {}, ("working_set", "gamma_grid")),
    ("full rank, small: the grid", BudgetFacts(n=1000, rank=1000), {}, ("gamma_grid",)),
    ("working set off", BudgetFacts(n=3000, rank=1000), {"budget": {"working_set_max": 0}}, ("gamma_grid",)),
    ("the homotopy affordable only by the policy", BudgetFacts(n=3000, rank=1000), {"homotopy": {"max_work": 3e9}},
     ("homotopy", "working_set", "gamma_grid")),
]


@pytest.mark.parametrize(("case", "given", "changes", "expected"), BUDGET, ids=[row[0] for row in BUDGET])
def test_budget_plan(case, given, changes, expected):
    assert plan_budget(given, DEFAULT_POLICY.but(**changes)) == expected


@pytest.mark.parametrize(("n", "p", "ratio", "formed"), [
    (300, 400, DENSE, True),  # N <= p at a dense gamma: K is no larger than G
    (400, 400, DENSE, True),
    (401, 400, DENSE, False),  # N > p: K would be larger than G
    (300, 400, SPARSE, False),  # a sparse gamma: the support systems stay small
])
def test_the_gradient_form_forms_k_at_dense_gammas_where_n_is_at_most_p(n, p, ratio, formed):
    gradient = facts(n, min(n, p), ratio=ratio, gram=False)
    assert forms_gram(gradient, DEFAULT_POLICY) is formed
    assert not forms_gram(dataclasses.replace(gradient, gram=True), DEFAULT_POLICY)  # K is formed already


@pytest.mark.parametrize(("n", "rank", "gram", "changes", "reduced"), [
    (30000, 8192, False, {}, True),  # the gradient form, N > p, from reduced.min_n
    (5000, 4096, False, {}, True),
    (4999, 4096, False, {}, False),  # below reduced.min_n
    (6000, 6000, False, {}, False),  # N <= p: the gradient form forms K at a dense gamma instead
    (30000, 8192, True, {}, False),  # K formed: its rows are there already
    (30000, 8192, False, {"reduced": {"min_n": 0}}, False),  # off
])
def test_the_reduced_gram_working_set_is_for_the_gradient_form_with_n_above_p(n, rank, gram, changes, reduced):
    given = PenalisedFacts(n=n, rank=rank, gram=gram, gamma=1e-3, beta_max=1.0)
    assert reduces(given, DEFAULT_POLICY.but(**changes)) is reduced


def test_the_conditional_homotopy_steps_test_the_seed_against_the_wide_cap():
    cap = DEFAULT_POLICY.plan.wide_max
    assert seed_fills_wide(cap, DEFAULT_POLICY) and not seed_fills_wide(cap - 1, DEFAULT_POLICY)
    assert seed_fills_wide(10, DEFAULT_POLICY.but(plan={"wide_max": 10}))


def test_every_plan_lists_each_step_once_and_ends_with_the_fallbacks():
    """Over a grid of facts: no step twice, the fallbacks last and in order, the two conditional homotopy steps
    together around the wide working set, and ADMM in full wherever ADMM can run."""
    import itertools

    for n, share, ratio, gram, warm in itertools.product((100, 2000, 3000, 5000, 25000), (1.0, 0.3, 0.01),
                                                          (SPARSE, DENSE), (True, False), (True, False)):
        steps = plan_penalised(facts(n, max(1, int(share * n)), ratio=ratio, gram=gram, warm=warm), DEFAULT_POLICY)
        assert len(set(steps)) == len(steps)
        tail = steps[steps.index("nnls_polish"):]
        assert tail in (FALLBACKS, LARGE_FALLBACKS) and not set(tail) & set(steps[:-len(tail)])
        conditional = ("fallback_homotopy_if_seed_full", "fallback_homotopy_unless_seed_full")
        if conditional[0] in steps:
            i = steps.index(conditional[0])
            assert steps[i + 2] == conditional[1] and "wide_working_set" in steps[i + 1]
        assert ("admm" in steps) == (n <= DEFAULT_POLICY.plan.admm_max_n or not gram)


def test_the_policy_is_frozen_and_changed_only_by_copies():
    policy = SolverPolicy()
    assert policy == DEFAULT_POLICY and hash(policy) == hash(DEFAULT_POLICY)
    with pytest.raises(dataclasses.FrozenInstanceError):
        policy.plan.dense_ratio = 0.5
    changed = policy.but(plan={"dense_ratio": 0.5}, early_stop={"min_n": 0})
    assert changed.plan.dense_ratio == 0.5 and changed.early_stop.min_n == 0
    assert changed.plan.probe_max == policy.plan.probe_max and policy.plan.dense_ratio == 0.01
    with pytest.raises(TypeError, match="no section"):
        policy.but(plans={"dense_ratio": 0.5})
    with pytest.raises(TypeError):
        policy.but(plan={"dense_ration": 0.5})


def test_a_policy_steers_a_solve_through_the_public_entry_points():
    """solve_kmm, solve_kmm_gradients and kmm_path hand their policy down: a dense ratio above every gamma makes a
    sparse gamma plan as a dense one, with the same certified answer."""
    import numpy as np

    from convalue.solvers import kmm_path, solve_kmm, solve_kmm_gradients

    rng = np.random.default_rng(0)
    G, g = rng.normal(size=(40, 60)), rng.normal(size=60)
    K, beta = G @ G.T, G @ g
    gamma = 0.05 * float(np.abs(beta).max())
    everything_dense = DEFAULT_POLICY.but(plan={"dense_ratio": 1.0})
    for solve in (lambda **kw: solve_kmm(K, beta, gamma=gamma, **kw),
                  lambda **kw: solve_kmm_gradients(G, g, gamma=gamma, **kw)):
        sparse, dense = solve(), solve(policy=everything_dense)
        assert sparse.info["plan"][0] in ("pdas_direct", "working_set") and dense.info["plan"][0] == "admm_first"
        assert dense.kkt <= 1e-10 * max(1.0, float(np.abs(beta).max()))
        assert dense.objective == pytest.approx(sparse.objective, rel=1e-9, abs=1e-12)
    a = kmm_path(K, beta, n_gammas=5)
    b = kmm_path(K, beta, n_gammas=5, policy=everything_dense)
    np.testing.assert_allclose(a.W, b.W, rtol=0, atol=1e-8)
    assert b.kkt.max() <= 1e-10 * max(1.0, float(np.abs(beta).max()))
