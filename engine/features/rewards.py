"""GRPO reward functions r(completion, reference) -> float: the built-in numeric exact match, or one named by path."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import math
import re
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path

from convalue.engine.config.rewards import BUILTIN_REWARDS

RewardFn = Callable[[str, str], float]

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?|-?\.\d+")


class RewardError(ValueError):
    """A reward function that cannot be loaded, raises, or returns something other than a finite number."""


def last_number(text: str) -> Fraction | None:
    """The last number written in text (1,234 / -3.5 / 7/12), exactly, or None."""
    found = _NUMBER.findall(text)
    if not found:
        return None
    token = found[-1].replace(",", "")
    try:
        return Fraction(token)
    except (ValueError, ZeroDivisionError):
        return None


def final_answer(reference: str) -> Fraction:
    """The reference's numeric final answer (its last number, after `####` if present)."""
    expected = last_number(reference.split("####")[-1])
    if expected is None:
        raise RewardError(f"reference {reference[:80]!r} has no numeric final answer")
    return expected


def numeric_exact_match(completion: str, reference: str) -> float:
    """1.0 if the completion's last number equals the reference's final answer, else 0.0."""
    return 1.0 if last_number(completion) == final_answer(reference) else 0.0


def numeric_closeness(completion: str, reference: str) -> float:
    """1.0 for an exact numeric answer, else 0.5 * exp(-|x - y| / (|y| + 1)) for a wrong number x, 0.0 for none.

    A shaped reward for small models, whose exact-match rewards are almost all zero (no GRPO signal).
    """
    expected, got = final_answer(reference), last_number(completion)
    if got is None:
        return 0.0
    if got == expected:
        return 1.0
    return 0.5 * math.exp(-abs(float(got - expected)) / (abs(float(expected)) + 1.0))


BUILTIN: dict[str, RewardFn] = {"numeric_exact_match": numeric_exact_match, "numeric_closeness": numeric_closeness}
assert tuple(BUILTIN) == BUILTIN_REWARDS


def load_reward(spec: str) -> RewardFn:
    """The reward function named by spec: a built-in name, `module:function` or `path/to/file.py:function`."""
    if spec in BUILTIN:
        return BUILTIN[spec]
    if ":" not in spec:
        raise RewardError(f"unknown reward {spec!r}: use a built-in {sorted(BUILTIN)}, `module:function` "
                          "or `path/to/file.py:function`")
    where, name = spec.rsplit(":", 1)
    if where.endswith(".py"):
        path = Path(where).expanduser()
        if not path.is_file():
            raise RewardError(f"reward file {where!r} does not exist")
        module_spec = importlib.util.spec_from_file_location(f"convalue_reward_{path.stem}", path)
        module = importlib.util.module_from_spec(module_spec)
        try:
            module_spec.loader.exec_module(module)
        except Exception as exc:  # any import-time failure of user code is reported the same way
            raise RewardError(f"reward file {where!r} failed to import: {type(exc).__name__}: {exc}") from exc
    else:
        try:
            module = importlib.import_module(where)
        except Exception as exc:  # not found, or user code failing at import time
            raise RewardError(f"reward module {where!r} cannot be imported: {type(exc).__name__}: {exc}") from exc
    fn = getattr(module, name, None)
    if not inspect.isfunction(fn):
        raise RewardError(f"{where!r} has no function {name!r}")
    if fn.__module__ != module.__name__:  # `os:system` and other imported callables are not the user's reward
        raise RewardError(f"{spec!r} names {fn.__module__}.{fn.__name__}, which {where!r} imports: name a function "
                          "defined in the module or file itself")
    return fn


def score(fn: RewardFn, completion: str, reference: str, where: str) -> float:
    """fn(completion, reference) as a finite float; any failure names the group, prompt and completion."""
    try:
        value = float(fn(completion, reference))
    except Exception as exc:  # user code: every failure becomes one clear error, never a skipped prompt
        raise RewardError(f"{where}: reward function {getattr(fn, '__name__', fn)!r} raised "
                          f"{type(exc).__name__}: {exc} (completion {completion[:60]!r})") from exc
    if not math.isfinite(value):
        raise RewardError(f"{where}: reward function returned {value}, not a finite number")
    return value
