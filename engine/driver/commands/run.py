"""`convalue run CONFIG`: a valuation from a YAML config, or with --dry-run its plan."""

from __future__ import annotations

import argparse

import pyarrow as pa
import pyarrow.parquet as pq

from convalue.engine.config import RunConfig, config_from_dict, load_config
from convalue.engine.driver.commands.common import Command, input_errors, print_closing
from convalue.engine.files.folder import RunFolder
from convalue.engine.report.tables import (
    format_bootstrap,
    format_cluster_samples,
    format_evaluation,
    format_verdict,
)
from convalue.engine.store.record import run_folder_of
from convalue.engine.store.summary import RunSummary


def arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of `convalue run`."""
    p.add_argument("config", help="run config (YAML)")
    p.add_argument("--address", help="join this Ray cluster (else RAY_ADDRESS, else ray.address, else embedded)")
    p.add_argument("--out", help="parent folder of the run folder (overrides `out`)")
    p.add_argument("--name", help="run name (overrides `name`)")
    p.add_argument("--overwrite", action="store_true", help="replace stored vectors made with other settings")
    p.add_argument("--set", action="append", default=[], metavar="KEY.PATH=VALUE",
                   help="override a config field, e.g. --set solver.gamma=0.1 (repeatable; the value is read as YAML)")
    p.add_argument("--dry-run", action="store_true", help="print the plan (groups, tokens, fine-tunes, estimated "
                   "time measured on this machine) and exit, without starting Ray")


def handle(args: argparse.Namespace) -> int:
    """Run the valuation (or print its plan) and print the ranking, the selection and the evaluation."""
    cfg = load_config(args.config, args.set)
    if args.out or args.name:
        data = cfg.to_dict() | {k: v for k, v in (("out", args.out), ("name", args.name)) if v}
        cfg = config_from_dict(data, file=args.config)
    if args.dry_run:
        # imports Ray (the plan shares the driver's stages): only for a dry run
        from convalue.engine.driver.plan import format_plan, make_plan

        print(format_plan(make_plan(cfg), cfg))
        return 0
    # imports Ray and torch's workers: only when a run is asked for
    from convalue.engine.driver.pipeline import run

    summary = run(cfg, address=args.address, overwrite=args.overwrite)
    run_dir = run_folder_of(cfg.out, cfg.name)
    _print_results(summary, cfg, run_dir)
    print_closing(summary.timings_s, run_dir)
    return 0


def _print_results(summary: RunSummary, cfg: RunConfig, run_dir: RunFolder) -> None:
    """The ranking, the selection (with sample prompts of its clusters), the evaluation, its verdict, the solver."""
    print("\n".join(summary.ranking))
    print(f"\nselected (top-{cfg.select.k} with positive score): {', '.join(summary.selected) or 'none'}")
    if summary.bootstrap:
        print(format_bootstrap(summary.bootstrap))
    if run_dir.is_file("clusters.parquet") and summary.selected:
        clusters = pq.read_table(pa.BufferReader(run_dir.read_bytes("clusters.parquet")), columns=["group", "prompt"])
        print(format_cluster_samples(clusters, summary.selected))
    print(format_evaluation(summary.finetune, summary.evaluation))
    if verdict := format_verdict(summary.finetune, summary.evaluation, (summary.data or {}).get("target_train")):
        print(verdict)
    print(f"\nsolver: {summary.solver.describe()}")


RUN = Command("run", "run a valuation from a YAML config", arguments, handle, refuses=input_errors,
              writes_a_run=True)
