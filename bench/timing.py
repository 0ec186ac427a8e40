"""The benches' timer: the best of a few runs (this shared 2-core host is noisy), with the call's result."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager


def timed(fn, *args, repeat: int = 1, **kwargs):
    """(best seconds, last result) of fn(*args, **kwargs) over `repeat` runs."""
    best, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn(*args, **kwargs)
        best = min(best, time.perf_counter() - t0)
    return best, out


@contextmanager
def swapped(module, name: str, value) -> Iterator[None]:
    """module.name set to value inside the block: a bench's "before", where the solver reads that constant at call time."""
    kept = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, kept)


def interleaved(rounds: int, names: Iterable[str]) -> Iterator[tuple[int, str]]:
    """(round, name) for every version in every round, each round starting with the next version in turn, so that
    this host's drift does not favour one."""
    names = list(names)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            yield r, name


def versus(times: dict[str, list[float]]) -> tuple[dict[str, float], float, dict]:
    """(each version's best seconds, before's best over now's, the JSON fields now_s, before_s and speedup)."""
    best = {v: min(ts) for v, ts in times.items()}
    ratio = best["before"] / best["now"]
    return best, ratio, {"now_s": [round(x, 4) for x in times["now"]],
                         "before_s": [round(x, 4) for x in times["before"]], "speedup": round(ratio, 2)}
