"""`convalue status RUN_DIR`, `convalue report RUN_DIR` and `convalue list RUNS_DIR`: they read run folders, no Ray."""

from __future__ import annotations

import argparse
import json
import sys

from convalue.engine.driver.commands.common import Command, read_errors
from convalue.engine.report.html import write_report_noting
from convalue.engine.report.status_text import format_runs, format_status, list_runs
from convalue.engine.store.status import run_status


def status_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of `convalue status`."""
    p.add_argument("run_dir")
    p.add_argument("--json", action="store_true", help="print the status as one JSON object")
    p.add_argument("--quick", action="store_true", help="check that the vector blocks exist, without hashing them")


def status(args: argparse.Namespace) -> int:
    """Print the run folder's state and what it holds; the state's exit code (it probes the run's lock)."""
    found = run_status(args.run_dir, quick=args.quick)
    print(json.dumps(found.to_dict()) if args.json else format_status(found))
    return found.exit_code


def report_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of `convalue report`."""
    p.add_argument("run_dir")


def report(args: argparse.Namespace) -> int:
    """Write the run's report.html again and print its path; 1 when some of the folder's files could not be used."""
    path, problems = write_report_noting(args.run_dir)
    print(path)
    if problems:  # the page says so too; exit code 1, as `convalue status` for a damaged folder
        print(f"convalue: warning: {len(problems)} file(s) of the run folder could not be used: "
              + "; ".join(problems), file=sys.stderr)
        return 1
    return 0


def list_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of `convalue list`."""
    p.add_argument("runs_dir", nargs="?", default="runs")


def list_(args: argparse.Namespace) -> int:
    """Print one line per run folder under RUNS_DIR."""
    print(format_runs(list_runs(args.runs_dir)))
    return 0


STATUS = Command("status", "say whether a run folder is complete, failed, running or interrupted, and what it "
                           "holds (exit 0 complete, 1 failed, interrupted or damaged, 3 running)",
                 status_arguments, status, refuses=read_errors)
REPORT = Command("report", "write RUN_DIR/report.html again (one self-contained page) and print its path",
                 report_arguments, report, refuses=read_errors)
LIST = Command("list", "list the runs under RUNS_DIR with their status, target and top picks",
               list_arguments, list_, refuses=read_errors)
