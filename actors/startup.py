"""An actor's start-up error kept and raised by each call, where the driver reports it as one line.

Raised from the constructor instead, Ray would restart the actor (max_restarts) and print every traceback, and
its ActorDiedError does not carry the exception."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class DeferredStartup:
    """Mixin: build state with _start(), which keeps an input error; call _ready() at the top of every method."""

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
