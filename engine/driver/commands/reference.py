"""`convalue config-reference`: every config field, its default and what it means, as Markdown."""

from __future__ import annotations

import argparse

from convalue.engine.config import reference_markdown
from convalue.engine.driver.commands.common import Command


def arguments(p: argparse.ArgumentParser) -> None:
    """`convalue config-reference` takes no arguments."""


def handle(args: argparse.Namespace) -> int:
    """Print the config reference."""
    print(reference_markdown())
    return 0


CONFIG_REFERENCE = Command("config-reference", "print the config reference (Markdown)", arguments, handle)
