"""Keep a pool of actors busy with a bounded window of calls; yield results as they finish (ray.wait)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import ray


class WorkItemError(RuntimeError):
    """A call of windowed() failed: `what` names its payload, `cause` is the worker's own exception (None when
    the worker died or the call was lost rather than raising)."""

    def __init__(self, what: str, exc: BaseException):
        self.what = what
        self.cause = exc.cause if isinstance(exc, ray.exceptions.RayTaskError) else None
        super().__init__(f"work item {what} failed: {exc}")


def windowed(workers: list, payloads: list[Any], call: Callable[[Any, Any], Any],
             max_in_flight: int, cost: Callable[[Any], float] | None = None) -> Iterator[tuple[Any, Any]]:
    """Yield (payload, result) in completion order, never more than max_in_flight calls outstanding.

    call(worker, payload) must return an ObjectRef. Each new call goes to the worker with the least
    outstanding work: the sum of cost(payload) over its calls in flight (default: their count).
    Payloads are sent in the given order (send the costliest first to balance the tail).
    A failed call raises with its payload named (nothing is skipped).
    """
    cost = cost or (lambda _: 1.0)
    pending = list(reversed(payloads))
    inflight: dict[Any, tuple[Any, int]] = {}
    load = [0.0] * len(workers)
    while pending or inflight:
        while pending and len(inflight) < max_in_flight:
            w = min(range(len(workers)), key=lambda i: load[i])
            payload = pending.pop()
            inflight[call(workers[w], payload)] = (payload, w)
            load[w] += cost(payload)
        [done], _ = ray.wait(list(inflight), num_returns=1)
        payload, w = inflight.pop(done)
        load[w] -= cost(payload)
        try:
            result = ray.get(done)
        except Exception as exc:
            for ref in inflight:
                ray.cancel(ref)
            raise WorkItemError(describe(payload), exc) from exc
        yield payload, result


def describe(payload: Any) -> str:
    """Short description of a payload (group names for gradient blocks)."""
    if isinstance(payload, (list, tuple)) and payload and hasattr(payload[0], "name"):
        return "[" + ", ".join(p.name for p in payload) + "]"
    return repr(payload)[:200]
