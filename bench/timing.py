"""The benches' timer: the best of a few runs (this shared 2-core host is noisy), with the call's result."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

import numpy as np


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


def race(rounds: int, label: str, run: Callable[[str], tuple[float, np.ndarray, dict]],
         certify: Callable[[np.ndarray, dict], tuple[float, float]]) -> tuple[dict[str, list[float]], dict[str, tuple]]:
    """"now" and "before", `rounds` times each, interleaved: run(name) -> (seconds, w, info) and certify(w, info) ->
    (KKT, objective), a line printed per run; (each version's times, its last (w, info, KKT, objective))."""
    times: dict[str, list[float]] = {"now": [], "before": []}
    out: dict[str, tuple] = {}
    for r, name in interleaved(rounds, times):
        t, w, info = run(name)
        out[name] = (w, info, *certify(w, info))
        times[name].append(t)
        print(f"{label} round {r + 1} {name:<6} {t:8.3f} s  {info['strategy']}, {np.count_nonzero(w)} active, "
              f"KKT {out[name][2]:.1e}", flush=True)
    return times, out


def versus(times: dict[str, list[float]]) -> tuple[dict[str, float], float, dict]:
    """(each version's best seconds, before's best over now's, the JSON fields now_s, before_s and speedup)."""
    best = {v: min(ts) for v, ts in times.items()}
    ratio = best["before"] / best["now"]
    return best, ratio, {"now_s": [round(x, 4) for x in times["now"]],
                         "before_s": [round(x, 4) for x in times["before"]], "speedup": round(ratio, 2)}
