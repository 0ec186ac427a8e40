"""`convalue score VECTORS` and `convalue solve RUN_DIR`: KMM on vectors or a Gram that already exist, no model."""

from __future__ import annotations

import argparse

from convalue.engine.config import ConfigError
from convalue.engine.driver.commands.common import Command, input_errors, print_closing


def score_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of `convalue score`."""
    p.add_argument("vectors", help="Parquet file (columns group, vector[, n_examples]) or run folder; local or URI")
    p.add_argument("--target", help="the target vector: a .npy or a one-row Parquet with column vector")
    p.add_argument("--target-group", default="__target__", help="else the row of VECTORS with this group name")
    form = p.add_mutually_exclusive_group(required=True)
    form.add_argument("--gamma", type=float, help="penalised form with this gamma")
    form.add_argument("--gamma-ratio", type=float, help="penalised form, gamma as a fraction of gamma_max")
    form.add_argument("--budget", type=float, help="budget form ||w||_1 <= BUDGET")
    p.add_argument("--normalize", choices=["none", "cosine"], default="cosine")
    p.add_argument("--metric", choices=["euclidean", "diag_fisher"], default="euclidean")
    p.add_argument("--space", choices=["auto", "gram", "gradients"], default="auto")
    p.add_argument("--k", type=int, default=3, help="select the top-k positive groups")
    p.add_argument("--out", default="runs", help="parent folder of the run folder (local or URI)")
    p.add_argument("--name", default="scored", help="run folder name")
    p.add_argument("--overwrite", action="store_true", help="import and value the vectors afresh (without it, a "
                   "run folder that valued some of them before values only what is new)")
    p.add_argument("--max-gather-gb", type=float, default=None,
                   help="gradient space: the most GB of G one process may gather; a larger G stays in its blocks "
                        "and is solved by products where they live (default 1)")


def score(args: argparse.Namespace) -> int:
    """Value the vectors into a new run folder and print the ranking (first 32), the selection and the solver."""
    # imports the solvers (and, where a prior does not certify in the driver, Ray): only when scoring
    from convalue.engine.driver.score import ScoreRequest, score
    from convalue.solvers.sharded import DEFAULT_SHARD_POLICY, ShardPolicy

    shard = DEFAULT_SHARD_POLICY
    if args.max_gather_gb is not None:
        if not args.max_gather_gb > 0:
            raise ConfigError("must be a positive number of GB", field="--max-gather-gb", value=args.max_gather_gb)
        shard = ShardPolicy(max_gather_bytes=int(args.max_gather_gb * 2**30))
    summary = score(ScoreRequest(
        vectors=args.vectors, out=args.out, name=args.name, target=args.target, target_group=args.target_group,
        gamma=args.gamma, gamma_ratio=args.gamma_ratio, budget=args.budget, normalize=args.normalize,
        metric=args.metric, space=args.space, k=args.k, overwrite=args.overwrite, shard=shard))
    print("\n".join(summary.ranking[:32]))
    print(f"\nselected (top-{args.k} with positive score): {', '.join(summary.selected) or 'none'}")
    print(f"solver: {summary.solver.describe()}")
    print_closing(summary.timings_s)
    return 0


def solve_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of `convalue solve`."""
    p.add_argument("run_dir")
    form = p.add_mutually_exclusive_group()
    form.add_argument("--gamma", type=float, help="penalised form with this gamma")
    form.add_argument("--budget", type=float, help="budget form ||w||_1 <= BUDGET")
    p.add_argument("--method", choices=["auto", "active_set", "cvxpy", "cvxpy_paper"])
    p.add_argument("--normalize", choices=["none", "cosine"])
    p.add_argument("--tol", type=float, help="stop the penalised form at this KKT violation (as solver.tol; "
                   "default: the run's own)")


def solve(args: argparse.Namespace) -> int:
    """Re-solve the finished run and print its new ranking, selection and solver outcome."""
    # imports SciPy (the solvers): only when re-solving
    from convalue.engine.driver.resolve import resolve

    summary = resolve(args.run_dir, gamma=args.gamma, budget=args.budget, method=args.method,
                      normalize=args.normalize, tol=args.tol)
    print("\n".join(summary.ranking))
    sol = summary.solver
    print(f"\nselected: {', '.join(summary.selected) or 'none'}; solver {sol.method} {sol.form} "
          f"status={sol.status} kkt={sol.kkt:.2e}")
    if summary.finetune_stale:
        print(f"note: {summary.finetune_stale}")
    return 0


SCORE = Command("score", "value vectors that already exist (a Parquet of group, vector rows, or an earlier run "
                         "folder) without a model: Gram, KMM, selection, report",
                score_arguments, score, refuses=input_errors, writes_a_run=True)
SOLVE = Command("solve", "re-solve a finished run from its gram.npy/beta.npy and rewrite its scores",
                solve_arguments, solve, refuses=input_errors, writes_a_run=True)
