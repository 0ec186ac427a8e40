"""The data types every data module shares: chat examples, named groups of them, the data error, Parquet reading."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow.parquet as pq

if TYPE_CHECKING:
    import pyarrow as pa

ROLES = ("system", "user", "assistant")


class DataError(ValueError):
    """A data problem, naming the source (file, row, field) and what is wrong."""


@dataclass(frozen=True)
class Example:
    """One chat example: a tuple of (role, content) messages; assistant turns are the response."""

    messages: tuple[tuple[str, str], ...]

    def as_chat(self) -> list[dict]:
        """Messages in the Hugging Face chat-template format."""
        return [{"role": r, "content": c} for r, c in self.messages]


@dataclass
class Group:
    """A named candidate (or the target) and its examples."""

    name: str
    examples: list[Example]
    origin: str
    #: a cluster of a flat pool: (source group, index of the example there) for each example
    members: list[tuple[str, int]] | None = None


def read_parquet(path: Path, error: type[Exception] = DataError) -> pa.Table:
    """The pyarrow Table of a Parquet file; error(message naming the file) where it cannot be read."""
    try:
        return pq.read_table(path)
    except Exception as exc:  # pyarrow raises several types for unreadable files
        raise error(f"{path}: not a readable Parquet file ({exc})") from None
