"""SolverPolicy: every threshold that steers the KMM solver, in one frozen object passed down from the entry points.

Each field says what it decides; docs/solver.md gives the measurement behind each value. Change a field with
policy.but(section={"field": value}) (or dataclasses.replace on a section): the solver never reads a module global.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ValidationPolicy:
    """make_problem's check of K: which factor or estimate certifies PSD-ness and gives the rank."""

    #: eigenvalues (and Cholesky pivots) at or below this fraction of the largest count as zero for K's rank
    rank_rtol: float = 1e-10
    #: where no Cholesky factor certifies K, a dense eigvalsh names lambda_min exactly up to this N
    eigvalsh_max_n: int = 3000
    #: the Cholesky factors certify K up to this N (K's copy and the factor: 1 GB at 8000) ...
    pivoted_max_n: int = 8000
    #: ... and beyond it where a caller's rank bound r puts the pivoted factor's cost, 2 N^2 r, at most this
    pivoted_max_work: float = 1e12
    #: beyond the factors, LOBPCG's block of seeded vectors for the lambda_min estimate ...
    estimate_block: int = 16
    #: ... and its iterations (a fixed cost: it stops unconverged by design)
    estimate_iters: int = 40
    #: the side of the square tiles K is symmetrised in: a tile and its mirror stay in cache
    symmetrise_tile: int = 256


@dataclass(frozen=True)
class LinalgPolicy:
    """The support systems' precision, the matrices kept between solves, and the BLAS thread limit."""

    #: support systems at least this large factor in float32 and are refined to float64 accuracy
    mixed_min_n: int = 256
    #: a float32 copy of K (4 N^2 bytes) is kept up to this N
    float32_copy_max_n: int = 8192
    #: the gradient form keeps its last G_A G_A^T up to this size (the NNLS polish's sets are never larger)
    sub_keep_max_n: int = 3000
    #: one BLAS thread up to this N, where thread hand-offs outweigh the work of each call
    single_thread_max_n: int = 2000


@dataclass(frozen=True)
class PlanPolicy:
    """The order in which the penalised form tries its strategies (convalue.solvers.plan)."""

    #: solutions at gamma below this fraction of max|beta| count as dense: ADMM goes first
    dense_ratio: float = 0.01
    #: an affordable rank-deficient K puts the working set before the full homotopy from this N ...
    working_set_first_min_n: int = 2000
    #: ... at gamma of at least this fraction of max|beta| (a sparse solution: the working set stays small)
    working_set_first_ratio: float = 0.03
    #: a dense gamma on a rank-deficient K, or on at least probe_min_n candidates, tries a working set first ...
    probe_min_n: int = 2000
    #: ... from this many candidates ...
    probe_start: int = 32
    #: ... up to this many (0: no probe): cheap where it gives up, a dense gamma can have a sparse solution
    probe_max: int = 64
    #: a formed K runs ADMM up to this N (it factors N x N); the gradient form always can (it factors p x p)
    admm_max_n: int = 20000
    #: ADMM's first rho runs this many steps first, then the wide working set, then ADMM in full (0: in full)
    admm_first_steps: int = 200
    #: the working set after ADMM's first steps grows to this many candidates
    wide_max: int = 2048
    #: where K is formed, that working set starts from ADMM's first iterate (fewer LARS rounds)
    wide_seeded: bool = True
    #: where the wide working set gives up on a rank-deficient K of N rank^2 up to this, the full homotopy follows
    homotopy_fallback_work: float = 8e9
    #: the CVXPY reference is the fallback after the NNLS polish up to this N (its dense quad_form)
    reference_max_n: int = 3000


@dataclass(frozen=True)
class ReducedPolicy:
    """The reduced-Gram working set (convalue.solvers.reduced): dense solutions of many candidates, gradient form."""

    #: the gradient form at a dense gamma with N > p tries it from this many candidates (0: never)
    min_n: int = 5000
    #: its first working set: the candidates of largest |beta| ...
    start: int = 1024
    #: ... each round adds the worst violators: this share of |W| ...
    growth: float = 0.25
    #: ... or at least this many (where there are) ...
    min_growth: int = 256
    #: ... up to this many candidates (K_WW and its factor share 4 |W|^2 bytes: 0.77 GiB at 14336) ...
    max_size: int = 14336
    #: ... where W's zeros with |r_i| below this fraction of gamma leave it to make room (the factor is then redone)
    prune_below: float = 0.75
    #: a round's ADMM steps (without a polish) stop once the signs hold for admm.settle steps, or after this many
    round_steps: int = 50
    #: ADMM + polish solves W exactly once the last round left at most this many violators outside W
    polish_violators: int = 256
    #: a support's float64 rows of G (|A| p 8 bytes) are copied once for its refinement up to this size, else read a
    #: block at a time
    gather_max_bytes: int = 1 << 28


@dataclass(frozen=True)
class HomotopyPolicy:
    """The LARS homotopy (convalue.solvers.homotopy): where it is affordable, and its duplicate search."""

    #: the full homotopy is affordable up to N rank^2 of this (its cost grows like N rank^2)
    max_work: float = 2e9
    #: in the gradient form, where LARS on X = G^T ends off the path, LARS on K formed once up to this N
    gram_max_n: int = 8000
    #: the duplicate search checks at most this many candidate pairs exactly (beyond: sorted neighbours only)
    max_pairs: int = 4_000_000


@dataclass(frozen=True)
class WorkingSetPolicy:
    """The working-set homotopy (convalue.solvers.working_set): its first set and its cap."""

    #: the first working set: the candidates of largest |beta|
    start: int = 128
    #: the largest working set before it gives up (LARS costs about |W|^3 on it)
    max_size: int = 1024


@dataclass(frozen=True)
class AdmmPolicy:
    """ADMM + polish (convalue.solvers.admm) for dense solutions."""

    #: ADMM's first rho, relative to mean K_ii, is this times gamma / max|beta| ...
    rho_per_ratio: float = 125.0
    #: ... clipped below at this ...
    rho_min: float = 0.01
    #: ... and above at this
    rho_max: float = 1.0
    #: the further rhos (relative to mean K_ii) ADMM in full tries where the first does not converge
    rho_retries: tuple[float, ...] = (3.0, 0.03)
    #: the steps of each of ADMM's runs in full
    max_iter: int = 1000
    #: the polish runs once the iterate's support and signs have held for this many steps
    settle: int = 3


@dataclass(frozen=True)
class EarlyStopPolicy:
    """Where a stopping tolerance (solve_kmm's tol) lets ADMM return its own iterate instead of polishing."""

    #: no early stop for tol below this: ADMM's float32 iterate stalls above it
    min_tol: float = 3e-7
    #: nor below this N, where each step's Python overhead outweighs the polish it saves
    min_n: int = 400
    #: nor on a support s with s^3 at most this times N^2, whose factorisation is cheaper than going on
    cube_ratio: float = 150.0
    #: nor where the shifted factor's pivots bound lambda_min(K) at or below this times mean K_ii
    min_lambda: float = 0.01
    #: the float64 KKT check runs at least every this many steps (and the stall window is as long)
    check_every: int = 8
    #: ADMM gives up (polishes) where the KKT violation fell by less than this factor over a window
    stall: float = 0.1
    #: the early stop's Anderson memory (0: plain ADMM steps)
    anderson_memory: int = 5


@dataclass(frozen=True)
class BudgetPolicy:
    """The budget form's working set (convalue.solvers.budget) before its gamma grid."""

    #: the working set grows to at most this many candidates (0: never tried) ...
    working_set_max: int = 2048
    #: ... and is tried where K is rank-deficient or has at least this many candidates ...
    working_set_min_n: int = 2000
    #: ... and gives up where W's path heads for more active candidates than this
    working_set_active: int = 1280


@dataclass(frozen=True)
class SolverPolicy:
    """Every threshold that steers the solver, by section; SolverPolicy() is the measured default."""

    validation: ValidationPolicy = field(default_factory=ValidationPolicy)
    linalg: LinalgPolicy = field(default_factory=LinalgPolicy)
    plan: PlanPolicy = field(default_factory=PlanPolicy)
    reduced: ReducedPolicy = field(default_factory=ReducedPolicy)
    homotopy: HomotopyPolicy = field(default_factory=HomotopyPolicy)
    working_set: WorkingSetPolicy = field(default_factory=WorkingSetPolicy)
    admm: AdmmPolicy = field(default_factory=AdmmPolicy)
    early_stop: EarlyStopPolicy = field(default_factory=EarlyStopPolicy)
    budget: BudgetPolicy = field(default_factory=BudgetPolicy)

    def but(self, **sections: Mapping[str, object]) -> SolverPolicy:
        """A copy with some fields of some sections changed: policy.but(early_stop={"min_lambda": 0.0})."""
        unknown = set(sections) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise TypeError(f"SolverPolicy has no section {sorted(unknown)}")
        return dataclasses.replace(self, **{name: dataclasses.replace(getattr(self, name), **dict(changes))
                                            for name, changes in sections.items()})


DEFAULT_POLICY = SolverPolicy()
