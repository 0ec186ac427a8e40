"""Command line: the `convalue` commands, registered in COMMANDS (each one unit in engine/driver/commands/: its
arguments and its handler), parsed and run here with the error handling they share.

Exit codes every command shares: 2 for a refused input (one `convalue: error:` line, no traceback); 130 or 143
when SIGINT or SIGTERM stopped a command that writes a run (its summary.json records the signal); 141 (128 +
SIGPIPE, as a shell reports a writer whose pipe closed) when the reader of stdout went away, as in
`convalue status RUN | head -1`: the rest of the output is dropped quietly. `status` and `report` add their own.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import select
import sys
from collections.abc import Iterator

from tqdm.contrib.logging import logging_redirect_tqdm

from convalue import __version__
from convalue.engine.config import ConfigError
from convalue.engine.driver import signals
from convalue.engine.driver.commands import analyses, folders, reference, run, scoring
from convalue.engine.driver.commands.common import Command, worker_input_error
from convalue.engine.report.bars import wanted

#: every command, in the order `convalue --help` lists them
COMMANDS: dict[str, Command] = {c.name: c for c in (
    run.RUN, analyses.FAITHFULNESS, analyses.TRANSFER, scoring.SOLVE, folders.STATUS, scoring.SCORE, folders.REPORT,
    folders.LIST, reference.CONFIG_REFERENCE)}
#: the exit code when stdout's reader went away: 128 + SIGPIPE, as a shell reports a writer the pipe ended
EXIT_CLOSED_PIPE = 141


class _Parser(argparse.ArgumentParser):
    """argparse with the one-line `convalue: error:` of every other refusal (exit code 2)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        """Print the problem in one line, pointing at --help, and exit with 2."""
        self.exit(2, f"convalue: error: {message} (see `{self.prog} --help`)\n")


def _parser() -> argparse.ArgumentParser:
    """The parser: one subparser per registered command."""
    p = _Parser(prog="convalue", description="Value candidate datasets for a target task (KMM in gradient space).",
                epilog="Exit codes: 2 a refused input; 130/143 stopped by SIGINT/SIGTERM; 141 the reader of the "
                       "output went away (`| head`); `status` and `report` add their own.")
    p.add_argument("--version", action="version", version=f"convalue {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    for command in COMMANDS.values():
        command.arguments(sub.add_parser(command.name, help=command.help))
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `convalue` console script: parse, run the command, its exit code."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s convalue %(levelname)s %(message)s",
                        datefmt="%H:%M:%S", stream=sys.stderr)
    # convalue's own INFO lines; other libraries' (matplotlib's "generated new fontManager") would read as ours
    logging.getLogger("convalue").setLevel(logging.INFO)
    try:
        with _logs_above_bars():
            code = _dispatch(COMMANDS[args.command], args)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's exit
        return code
    except BrokenPipeError:
        if not _stdout_closed():
            raise
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the unwritten rest goes nowhere, quietly
        return EXIT_CLOSED_PIPE


def _dispatch(command: Command, args: argparse.Namespace) -> int:
    """Run one command; a refused input is one `convalue: error:` line and exit 2."""
    refused = command.refuses()
    if command.writes_a_run:
        signals.install()
    try:
        return command.handler(args)
    except BrokenPipeError:
        raise  # an OSError, but no refused input: main() ends it quietly
    except refused as exc:
        if isinstance(exc, ConfigError) and exc.file is None and getattr(args, "config", None):
            exc = ConfigError(exc.reason, file=args.config, field=exc.field, value=exc.value)  # found after loading
        print(f"convalue: error: {exc}", file=sys.stderr)
        return 2
    except BaseException as exc:
        if not command.writes_a_run:
            raise
        if (what := worker_input_error(exc, refused)) is not None:  # a worker found it: no remote traceback
            print(f"convalue: error: {what}", file=sys.stderr)
            return 2
        if (stopped := signals.received()) is None:  # a fault of convalue or of Ray: the full traceback
            raise
        print(f"convalue: {stopped}; the run folder's summary.json records it", file=sys.stderr)
        return stopped.exit_code


@contextlib.contextmanager
def _logs_above_bars() -> Iterator[None]:
    """With progress bars on a terminal, log lines are printed above the bars, not through them."""
    if not wanted():
        yield
        return
    with logging_redirect_tqdm(loggers=[logging.getLogger("convalue")]):
        yield


def _stdout_closed() -> bool:
    """Whether stdout is a pipe whose reader has gone (a BrokenPipeError from elsewhere is a fault to show)."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # replaced by a stream without a descriptor, as under pytest
        return False
    poll = select.poll()
    poll.register(fd, select.POLLOUT)
    return any(events & select.POLLERR for _, events in poll.poll(0))


if __name__ == "__main__":
    sys.exit(main())
