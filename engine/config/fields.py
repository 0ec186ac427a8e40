"""The config's building blocks: the error every check raises, the documented field, and type names."""

from __future__ import annotations

import dataclasses
import os
import types
import typing
from dataclasses import field
from pathlib import Path
from typing import Any, Literal


class ConfigError(ValueError):
    """A configuration problem, naming the file, the field and the bad value."""

    def __init__(self, message: str, *, file: str | None = None, field: str | None = None,
                 value: Any = dataclasses.MISSING):
        self.file, self.field, self.value, self.reason = file, field, value, message
        where = ": ".join(x for x in (file, field) if x)
        shown = "" if value is dataclasses.MISSING else f" (got {value!r})"
        super().__init__(f"{where}: {message}{shown}" if where else f"{message}{shown}")


def check_readable(path: Path, field: str, value: Any, folder: bool = False) -> None:
    """Refuse a file (or folder) this process cannot read, before any model is loaded."""
    if not os.access(path, os.R_OK | (os.X_OK if folder else 0)):
        raise ConfigError(f"cannot be read by this process (permission denied on {path})", field=field, value=value)


def check_writable(path: Path, field: str, value: Any) -> None:
    """Refuse a folder this process cannot create files in."""
    if not os.access(path, os.W_OK | os.X_OK):
        raise ConfigError(f"cannot be written by this process (permission denied on {path})", field=field,
                          value=value)


def opt(default: Any = dataclasses.MISSING, help: str = "", factory: Any = None) -> Any:
    """A dataclass field with its documentation attached."""
    if factory is not None:
        return field(default_factory=factory, metadata={"help": help})
    return field(default=default, metadata={"help": help})


def type_name(tp: Any) -> str:
    """Human-readable type for error messages and the reference."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        inner = [type_name(a) for a in args if a is not type(None)]
        return " or ".join(inner) + (" or null" if type(None) in args else "")
    if origin is Literal:
        return " / ".join(f"`{a}`" for a in args)
    if origin is list:
        return f"list of {type_name(args[0])}"
    if origin is dict:
        return f"mapping of {type_name(args[0])} to {type_name(args[1])}"
    if dataclasses.is_dataclass(tp):
        return "section"
    return {str: "string", int: "int", float: "number", bool: "bool"}.get(tp, getattr(tp, "__name__", str(tp)))
