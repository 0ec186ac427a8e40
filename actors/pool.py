"""One stage's Ray workers as a pool: created, start-up probed, fed through a bounded window, cancelled, killed."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import ray


class WorkItemError(RuntimeError):
    """A call of the pool failed: `what` names its payload, `cause` is the worker's own exception (None when
    the worker died or the call was lost rather than raising)."""

    def __init__(self, what: str, exc: BaseException | None = None, *, cause: BaseException | None = None,
                 message: str | None = None):
        self.what = what
        self.cause = exc.cause if isinstance(exc, ray.exceptions.RayTaskError) else cause
        super().__init__(message or f"work item {what} failed: {exc}")

    def __reduce__(self):  # crosses Ray from the actor that dispatched the work to the driver
        return (_rebuild, (self.what, self.cause, str(self)))


def _rebuild(what: str, cause: BaseException | None, message: str) -> WorkItemError:
    return WorkItemError(what, cause=cause, message=message)


class DeferredStartup:
    """Actor mixin: build state with _start(), which keeps an input error; call _ready() at the top of every method.

    Raised from the constructor instead, Ray would restart the actor (max_restarts) and print every traceback, and
    its ActorDiedError does not carry the exception."""

    _startup_error: Exception | None = None

    def _start(self, build: Callable[[], Any], errors: tuple[type[Exception], ...]) -> Any:
        """build(), or None with the error kept when it raises one of `errors` (a problem with the inputs)."""
        try:
            return build()
        except errors as exc:
            self._startup_error = exc
            return None

    def _ready(self) -> None:
        """Raise the kept start-up error, if any."""
        if self._startup_error is not None:
            raise self._startup_error


def windowed(workers: list, payloads: list[Any], call: Callable[[Any, Any], Any],
             max_in_flight: int, cost: Callable[[Any], float] | None = None) -> Iterator[tuple[Any, Any]]:
    """Yield (payload, result) in completion order, never more than max_in_flight calls outstanding.

    call(worker, payload) must return an ObjectRef. Each new call goes to the worker with the least
    outstanding work: the sum of cost(payload) over its calls in flight (default: their count).
    Payloads are sent in the given order (send the costliest first to balance the tail).
    A failed call cancels the others and raises WorkItemError with its payload named (nothing is skipped);
    so does leaving the loop early (an exception in the consumer, or close()).
    """
    cost = cost or (lambda _: 1.0)
    pending = list(reversed(payloads))
    inflight: dict[Any, tuple[Any, int]] = {}
    load = [0.0] * len(workers)
    try:
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
                raise WorkItemError(describe(payload), exc) from exc
            yield payload, result
    finally:
        for ref in inflight:
            ray.cancel(ref)


def describe(payload: Any) -> str:
    """Short description of a payload (group names for gradient blocks)."""
    if isinstance(payload, (list, tuple)) and payload and hasattr(payload[0], "name"):
        return "[" + ", ".join(p.name for p in payload) + "]"
    return repr(payload)[:200]


class ActorPool:
    """`count` actors of one Ray actor class, made with the same arguments; a context manager that kills them."""

    def __init__(self, actor_class: Any, count: int, *args: Any, options: dict | None = None,
                 name: str | None = None, **kwargs: Any):
        opts = dict(options or {})
        self.actors = [actor_class.options(**opts, **({"name": f"{name}-{i}-{os.getpid()}"} if name else {}))
                       .remote(*args, **kwargs) for i in range(max(1, count))]

    def __enter__(self) -> ActorPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __len__(self) -> int:
        return len(self.actors)

    def probe(self, method: str, what: str) -> Any:
        """The first actor's answer to method() — its start-up finished — or WorkItemError naming `what`."""
        try:
            return ray.get(getattr(self.actors[0], method).remote())
        except ray.exceptions.RayTaskError as exc:  # the actor could not be built from these inputs
            raise WorkItemError(f"{what} start-up", exc) from exc

    def map(self, payloads: list[Any], call: Callable[[Any, Any], Any], in_flight_per_actor: int,
            cost: Callable[[Any], float] | None = None) -> Iterator[tuple[Any, Any]]:
        """windowed() over this pool's actors with in_flight_per_actor calls outstanding per actor."""
        return windowed(self.actors, payloads, call, in_flight_per_actor * len(self.actors), cost)

    def close(self) -> None:
        """Kill every actor (their calls in flight die with them)."""
        for actor in self.actors:
            ray.kill(actor)
        self.actors = []
