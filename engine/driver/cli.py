"""Command line: `convalue run CONFIG`, `convalue solve RUN_DIR`, `convalue status RUN_DIR`, the analyses
`convalue faithfulness CONFIG` and `convalue transfer CONFIG`, `convalue config-reference`."""

from __future__ import annotations

import argparse
import logging
import sys


class _Parser(argparse.ArgumentParser):
    """argparse with the one-line `convalue: error:` of every other refusal (exit code 2)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        """Print the problem in one line, pointing at --help, and exit with 2."""
        self.exit(2, f"convalue: error: {message} (see `{self.prog} --help`)\n")


def _parser() -> argparse.ArgumentParser:
    from convalue import __version__

    p = _Parser(prog="convalue", description="Value candidate datasets for a target task (KMM in gradient space).")
    p.add_argument("--version", action="version", version=f"convalue {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run a valuation from a YAML config")
    r.add_argument("config", help="run config (YAML)")
    r.add_argument("--address", help="join this Ray cluster (else RAY_ADDRESS, else ray.address, else embedded)")
    r.add_argument("--out", help="parent folder of the run folder (overrides `out`)")
    r.add_argument("--name", help="run name (overrides `name`)")
    r.add_argument("--overwrite", action="store_true", help="replace stored vectors made with other settings")
    r.add_argument("--set", action="append", default=[], metavar="KEY.PATH=VALUE",
                   help="override a config field, e.g. --set solver.gamma=0.1 (repeatable; the value is read as YAML)")
    r.add_argument("--dry-run", action="store_true", help="print the plan (groups, tokens, fine-tunes, estimated "
                   "time measured on this machine) and exit, without starting Ray")
    for cmd, what in (("faithfulness", "subset faithfulness: fine-tune every k-subset of the candidates and compare "
                                        "u_FT with the additive and KMM surrogates of each representation "
                                        "(section `faithfulness`)"),
                      ("transfer", "pairwise transfer: every group as the target against the others from one "
                                   "featurisation, then the positive/negative-set fine-tunes (section `transfer`)")):
        a = sub.add_parser(cmd, help=what)
        a.add_argument("config", help="run config (YAML); the run folder's vectors and fine-tunes are reused")
        a.add_argument("--address", help="join this Ray cluster (else RAY_ADDRESS, else ray.address, else embedded)")
        a.add_argument("--overwrite", action="store_true", help="replace stored vectors made with other settings")
        a.add_argument("--set", action="append", default=[], metavar="KEY.PATH=VALUE",
                       help="override a config field, e.g. --set faithfulness.k=2 (repeatable; the value is read as "
                            "YAML)")
    s = sub.add_parser("solve", help="re-solve a finished run from its gram.npy/beta.npy and rewrite its scores")
    s.add_argument("run_dir")
    g = s.add_mutually_exclusive_group()
    g.add_argument("--gamma", type=float, help="penalised form with this gamma")
    g.add_argument("--budget", type=float, help="budget form ||w||_1 <= BUDGET")
    s.add_argument("--method", choices=["auto", "active_set", "cvxpy", "cvxpy_paper"])
    s.add_argument("--normalize", choices=["none", "cosine"])
    s.add_argument("--tol", type=float, help="stop the penalised form at this KKT violation (as solver.tol; "
                   "default: the run's own)")
    t = sub.add_parser("status", help="say whether a run folder is complete, failed, running or interrupted, and "
                                      "what it holds (exit 0 complete, 1 failed, interrupted or damaged, 3 running)")
    t.add_argument("run_dir")
    t.add_argument("--json", action="store_true", help="print the status as one JSON object")
    t.add_argument("--quick", action="store_true", help="check that the vector blocks exist, without hashing them")
    sc = sub.add_parser("score", help="value vectors that already exist (a Parquet of group, vector rows, or an "
                                      "earlier run folder) without a model: Gram, KMM, selection, report")
    sc.add_argument("vectors", help="Parquet file (columns group, vector[, n_examples]) or run folder; local or URI")
    sc.add_argument("--target", help="the target vector: a .npy or a one-row Parquet with column vector")
    sc.add_argument("--target-group", default="__target__", help="else the row of VECTORS with this group name")
    form = sc.add_mutually_exclusive_group(required=True)
    form.add_argument("--gamma", type=float, help="penalised form with this gamma")
    form.add_argument("--gamma-ratio", type=float, help="penalised form, gamma as a fraction of gamma_max")
    form.add_argument("--budget", type=float, help="budget form ||w||_1 <= BUDGET")
    sc.add_argument("--normalize", choices=["none", "cosine"], default="cosine")
    sc.add_argument("--metric", choices=["euclidean", "diag_fisher"], default="euclidean")
    sc.add_argument("--space", choices=["auto", "gram", "gradients"], default="auto")
    sc.add_argument("--k", type=int, default=3, help="select the top-k positive groups")
    sc.add_argument("--out", default="runs", help="parent folder of the run folder (local or URI)")
    sc.add_argument("--name", default="scored", help="run folder name")
    sc.add_argument("--overwrite", action="store_true", help="import the vectors afresh")
    rep = sub.add_parser("report", help="write RUN_DIR/report.html again (one self-contained page) and print its path")
    rep.add_argument("run_dir")
    ls = sub.add_parser("list", help="list the runs under RUNS_DIR with their status, target and top picks")
    ls.add_argument("runs_dir", nargs="?", default="runs")
    sub.add_parser("config-reference", help="print the config reference (Markdown)")
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `convalue` console script."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s convalue %(levelname)s %(message)s",
                        datefmt="%H:%M:%S", stream=sys.stderr)
    from convalue.engine.report.bars import wanted

    if wanted():  # progress bars on a terminal: log lines are printed above them, not through them
        from tqdm.contrib.logging import logging_redirect_tqdm

        with logging_redirect_tqdm(loggers=[logging.getLogger("convalue")]):
            return _command(args)
    return _command(args)


def _command(args: argparse.Namespace) -> int:
    """Run the parsed command; its exit code."""
    from convalue.engine.config import (
        ConfigError,
        config_from_dict,
        load_config,
        reference_markdown,
    )
    from convalue.engine.data.examples import DataError
    from convalue.engine.model.loading import ModelError
    from convalue.engine.store.vectors import StoreError
    from convalue.solvers import KMMInputError, KMMSolveError

    if args.command == "config-reference":
        print(reference_markdown())
        return 0
    if args.command in ("report", "list"):  # no Ray: they read run folders
        try:
            if args.command == "report":
                from convalue.engine.report.html import write_report_noting

                path, problems = write_report_noting(args.run_dir)
                print(path)
                if problems:  # the page says so too; exit code 1, as `convalue status` for a damaged folder
                    print(f"convalue: warning: {len(problems)} file(s) of the run folder could not be used: "
                          + "; ".join(problems), file=sys.stderr)
                    return 1
            else:
                from convalue.engine.report.listing import format_runs, list_runs

                print(format_runs(list_runs(args.runs_dir)))
        except (StoreError, OSError) as exc:
            print(f"convalue: error: {exc}", file=sys.stderr)
            return 2
        return 0
    if args.command == "status":  # no Ray: it reads the folder and probes its lock
        import json

        from convalue.engine.store.status import EXIT_CODES, format_status, run_status

        try:
            status = run_status(args.run_dir, quick=args.quick)
        except (StoreError, FileNotFoundError) as exc:
            print(f"convalue: error: {exc}", file=sys.stderr)
            return 2
        print(json.dumps(status) if args.json else format_status(status))
        return EXIT_CODES[status["state"]]
    from convalue.actors.pool import WorkItemError
    from convalue.engine.driver import signals
    from convalue.engine.driver.session import ClusterError
    from convalue.engine.features.grpo import GrpoError
    from convalue.engine.features.rewards import RewardError

    user_errors = (ConfigError, DataError, ModelError, StoreError, KMMInputError, KMMSolveError, GrpoError,
                   RewardError, ClusterError, FileNotFoundError, PermissionError)
    signals.install()
    try:
        if args.command == "run":
            import pyarrow as pa
            import pyarrow.parquet as pq

            from convalue.engine.driver.pipeline import run
            from convalue.engine.files.folder import RunFolder
            from convalue.engine.report.tables import (
                format_bootstrap,
                format_cluster_samples,
                format_evaluation,
                format_verdict,
            )

            cfg = load_config(args.config, args.set)
            if args.out or args.name:
                data = cfg.to_dict() | {k: v for k, v in (("out", args.out), ("name", args.name)) if v}
                cfg = config_from_dict(data, file=args.config)
            if args.dry_run:
                from convalue.engine.driver.plan import format_plan, make_plan

                print(format_plan(make_plan(cfg), cfg))
                return 0
            summary = run(cfg, address=args.address, overwrite=args.overwrite)
            run_dir = RunFolder.at(cfg.out, cfg.name)
            print("\n".join(summary.ranking))
            print(f"\nselected (top-{cfg.select.k} with positive score): {', '.join(summary.selected) or 'none'}")
            if summary.bootstrap:
                print(format_bootstrap(summary.bootstrap))
            if run_dir.is_file("clusters.parquet") and summary.selected:
                clusters = pq.read_table(pa.BufferReader(run_dir.read_bytes("clusters.parquet")),
                                         columns=["group", "prompt"])
                print(format_cluster_samples(clusters, summary.selected))
            print(format_evaluation(summary.finetune, summary.evaluation))
            if verdict := format_verdict(summary.finetune, summary.evaluation, (summary.data or {}).get("target_train")):
                print(verdict)
            print(f"\nsolver: {summary.solver.describe()}")
            print("timings (s): " + ", ".join(f"{k} {v:.1f}" for k, v in summary.timings_s.items()))
            print(f"outputs: {run_dir}/")
            return 0
        if args.command in ("faithfulness", "transfer"):
            from convalue.engine.files.folder import RunFolder

            cfg = load_config(args.config, args.set)
            if args.command == "faithfulness":
                from convalue.engine.driver.faithfulness import format_faithfulness as show
                from convalue.engine.driver.faithfulness import run_faithfulness as analysis
            else:
                from convalue.engine.driver.transfer import format_transfer as show
                from convalue.engine.driver.transfer import run_transfer as analysis
            summary = analysis(cfg, address=args.address, overwrite=args.overwrite)
            print(show(summary))
            print("timings (s): " + ", ".join(f"{k} {v:.1f}" for k, v in summary.timings_s.items()))
            print(f"outputs: {RunFolder.at(cfg.out, cfg.name)}/")
            return 0
        if args.command == "score":
            from convalue.engine.driver.score import ScoreRequest, score

            summary = score(ScoreRequest(
                vectors=args.vectors, out=args.out, name=args.name, target=args.target, target_group=args.target_group,
                gamma=args.gamma, gamma_ratio=args.gamma_ratio, budget=args.budget, normalize=args.normalize,
                metric=args.metric, space=args.space, k=args.k, overwrite=args.overwrite))
            print("\n".join(summary.ranking[:32]))
            print(f"\nselected (top-{args.k} with positive score): {', '.join(summary.selected) or 'none'}")
            print(f"solver: {summary.solver.describe()}")
            print("timings (s): " + ", ".join(f"{k} {v:.1f}" for k, v in summary.timings_s.items()))
            return 0
        if args.command == "solve":
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
    except user_errors as exc:
        if isinstance(exc, ConfigError) and exc.file is None and getattr(args, "config", None):
            exc = ConfigError(exc.reason, file=args.config, field=exc.field, value=exc.value)  # found after loading
        print(f"convalue: error: {exc}", file=sys.stderr)
        return 2
    except WorkItemError as exc:
        if not isinstance(exc.cause, user_errors):  # a fault of convalue or of Ray: the full traceback
            raise
        # a problem with the input that a worker found: its message, without the remote traceback
        print(f"convalue: error: {exc.what}: {exc.cause}", file=sys.stderr)
        return 2
    except BaseException:
        if (stopped := signals.received()) is None:
            raise
        print(f"convalue: {stopped}; the run folder's summary.json records it", file=sys.stderr)
        return stopped.exit_code
    return 1


if __name__ == "__main__":
    sys.exit(main())
