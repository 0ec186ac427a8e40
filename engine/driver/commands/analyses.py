"""`convalue faithfulness CONFIG` and `convalue transfer CONFIG`: the two analyses on a run's featurisation."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from convalue.engine.config import RunConfig, load_config
from convalue.engine.driver.commands.common import Command, input_errors, print_closing
from convalue.engine.store.record import run_folder_of
from convalue.engine.store.summary import RunSummary


def arguments(p: argparse.ArgumentParser) -> None:
    """The arguments both analyses take."""
    p.add_argument("config", help="run config (YAML); the run folder's vectors and fine-tunes are reused")
    p.add_argument("--address", help="join this Ray cluster (else RAY_ADDRESS, else ray.address, else embedded)")
    p.add_argument("--overwrite", action="store_true", help="replace stored vectors made with other settings")
    p.add_argument("--set", action="append", default=[], metavar="KEY.PATH=VALUE",
                   help="override a config field, e.g. --set faithfulness.k=2 (repeatable; the value is read as YAML)")


def faithfulness(args: argparse.Namespace) -> int:
    """Run the subset-faithfulness study and print its table."""
    cfg = load_config(args.config, args.set)
    # imports Ray: only when the analysis runs
    from convalue.engine.driver.faithfulness import format_faithfulness, run_faithfulness

    return _analyse(cfg, args, run_faithfulness, format_faithfulness)


def transfer(args: argparse.Namespace) -> int:
    """Run the pairwise-transfer study and print its table."""
    cfg = load_config(args.config, args.set)
    # imports Ray: only when the analysis runs
    from convalue.engine.driver.transfer import format_transfer, run_transfer

    return _analyse(cfg, args, run_transfer, format_transfer)


def _analyse(cfg: RunConfig, args: argparse.Namespace, analysis: Callable[..., RunSummary],
             show: Callable[[RunSummary], str]) -> int:
    """Run one analysis of the config and print what it found, its timings and its run folder."""
    summary = analysis(cfg, address=args.address, overwrite=args.overwrite)
    print(show(summary))
    print_closing(summary.timings_s, run_folder_of(cfg.out, cfg.name))
    return 0


FAITHFULNESS = Command(
    "faithfulness", "subset faithfulness: fine-tune every k-subset of the candidates and compare u_FT with the "
                    "additive and KMM surrogates of each representation (section `faithfulness`)",
    arguments, faithfulness, refuses=input_errors, writes_a_run=True)
TRANSFER = Command(
    "transfer", "pairwise transfer: every group as the target against the others from one featurisation, then the "
                "positive/negative-set fine-tunes (section `transfer`)",
    arguments, transfer, refuses=input_errors, writes_a_run=True)
