"""The benches' timer: the best of a few runs (this shared 2-core host is noisy), with the call's result."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator


def timed(fn, *args, repeat: int = 1, **kwargs):
    """(best seconds, last result) of fn(*args, **kwargs) over `repeat` runs."""
    best, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn(*args, **kwargs)
        best = min(best, time.perf_counter() - t0)
    return best, out


def interleaved(rounds: int, names: Iterable[str]) -> Iterator[tuple[int, str]]:
    """(round, name) for every version in every round, each round starting with the next version in turn, so that
    this host's drift does not favour one."""
    names = list(names)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            yield r, name
