"""GRPO reward functions r(completion, reference) -> float: the built-in numeric exact match, or one named by path."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import math
import re
import sys
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path

from convalue.engine.config import RunConfig
from convalue.engine.config.fields import ConfigError
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
        if where.split(".")[0] in sys.stdlib_module_names:  # `os:system`, `os:getenv`: never a user's reward
            raise RewardError(f"{where!r} is a module of Python's standard library, not a reward: name a function "
                              "defined in your own module or file")
        try:
            module = importlib.import_module(where)
        except Exception as exc:  # not found, or user code failing at import time
            raise RewardError(f"reward module {where!r} cannot be imported: {type(exc).__name__}: {exc}") from exc
    fn = getattr(module, name, None)
    if not callable(fn):
        raise RewardError(f"{where!r} has no function {name!r}")
    if not inspect.isfunction(fn) or fn.__module__ != module.__name__:  # an imported or built-in callable
        what = f"{getattr(fn, '__module__', None) or '?'}.{getattr(fn, '__qualname__', type(fn).__name__)}"
        raise RewardError(f"{spec!r} names {what}, not a function defined in {where!r} itself: name a function "
                          "the module or file defines")
    return fn


def rewards_in_use(cfg: RunConfig) -> list[tuple[str, str]]:
    """(field, reward spec) of each reward a run of cfg calls: features.grpo_reward for a `grpo` representation,
    finetune.accuracy_reward for the `accuracy` metric, finetune.grpo_reward for the `grpo` objective (the last two
    when it fine-tunes)."""
    out = []
    if "grpo" in (cfg.features.representations or [cfg.features.representation]):
        out.append(("features.grpo_reward", cfg.features.grpo_reward))
    if cfg.finetune.enabled and "accuracy" in cfg.finetune.metrics:
        out.append(("finetune.accuracy_reward", cfg.finetune.accuracy_reward))
    if cfg.finetune.enabled and cfg.finetune.objective == "grpo":
        out.append(("finetune.grpo_reward", cfg.finetune.grpo_reward))
    return out


def check_rewards(cfg: RunConfig) -> None:
    """Load each reward a run of cfg calls (rewards_in_use) before the work that calls it starts: one that cannot
    be loaded is a ConfigError naming its field now, not a failed stage hours later. Never called while a config is
    validated or a run planned (--dry-run): user code is imported only by a run that is about to call it."""
    for where, spec in rewards_in_use(cfg):
        try:
            load_reward(spec)
        except RewardError as exc:
            raise ConfigError(str(exc), field=where) from None


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
