"""What the commands share: the Command record, the errors they refuse in one line, the closing lines they print."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from convalue.engine.config import ConfigError
from convalue.engine.data.examples import DataError
from convalue.engine.features.grpo import GrpoError
from convalue.engine.features.rewards import RewardError
from convalue.engine.files.errors import StoreError
from convalue.engine.files.folder import RunFolder
from convalue.engine.model.loading import ModelError
from convalue.engine.report.status_text import timings_line

Errors = tuple[type[BaseException], ...]


def read_errors() -> Errors:
    """What a command that only reads a run folder refuses in one line: a damaged, missing or unreadable file."""
    return (StoreError, OSError)


def no_errors() -> Errors:
    """A command that reads no input refuses nothing: any exception is a fault of convalue (a traceback)."""
    return ()


def input_errors() -> Errors:
    """What a command that writes a run refuses in one line: a bad config, data, model, store, solve or cluster."""
    # imports SciPy (the solvers' errors): only the commands that use them ask for these
    from convalue.engine.driver.errors import ClusterError
    from convalue.solvers import KMMInputError, KMMSolveError

    return (ConfigError, DataError, ModelError, StoreError, KMMInputError, KMMSolveError, GrpoError, RewardError,
            ClusterError, FileNotFoundError, PermissionError)


def worker_input_error(exc: BaseException, refused: Errors) -> str | None:
    """`what: cause` when exc is a worker's failure over a refused input (its remote traceback left out), else None."""
    # imports Ray: WorkItemError lives beside the actor pool, which a command that writes a run has loaded already
    from convalue.actors.pool import WorkItemError

    if isinstance(exc, WorkItemError) and isinstance(exc.cause, refused):
        return f"{exc.what}: {exc.cause}"
    return None


@dataclass(frozen=True)
class Command:
    """One `convalue` command: its name and --help line, what adds its arguments, what runs it (the exit code)."""

    name: str
    help: str
    arguments: Callable[[argparse.ArgumentParser], None]
    handler: Callable[[argparse.Namespace], int]
    #: the exception types its handler raises for a bad input: one `convalue: error:` line, exit code 2
    refuses: Callable[[], Errors] = no_errors
    #: it writes a run folder: SIGINT and SIGTERM stop it with 130 or 143 (summary.json records the signal), and a
    #: worker's failure over a refused input is one line too
    writes_a_run: bool = False


def print_closing(timings_s: Mapping[str, float] | None, run_dir: RunFolder | None = None) -> None:
    """The last lines of a command that made or changed a run: the time of each stage, then where its outputs are."""
    print(timings_line(dict(timings_s or {})))
    if run_dir is not None:
        print(f"outputs: {run_dir}/")
