"""Reward names in a config, checked by their form only: user code is imported when it is about to run, never
while a config is validated (engine.features.rewards loads it)."""

from __future__ import annotations

import re
from pathlib import Path

#: the built-in rewards (engine.features.rewards.BUILTIN holds the functions)
BUILTIN_REWARDS = ("numeric_exact_match", "numeric_closeness")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def reward_spec_problem(spec: object) -> str | None:
    """Why `spec` cannot name a reward (None when it can): a built-in name, `module:function` or
    `path/to/file.py:function` with an existing file; nothing is imported."""
    if not isinstance(spec, str) or not spec:
        return "must be a built-in reward name, `module:function` or `path/to/file.py:function`"
    if spec in BUILTIN_REWARDS:
        return None
    if ":" not in spec:
        return (f"unknown reward {spec!r}: use a built-in {sorted(BUILTIN_REWARDS)}, `module:function` "
                "or `path/to/file.py:function`")
    where, name = spec.rsplit(":", 1)
    if not _IDENT.fullmatch(name):
        return f"{name!r} is not a function name"
    if where.endswith(".py"):
        if not Path(where).expanduser().is_file():
            return f"reward file {where!r} does not exist"
    elif not all(_IDENT.fullmatch(part) for part in where.split(".")):
        return f"{where!r} is neither a module name nor a .py file"
    return None
