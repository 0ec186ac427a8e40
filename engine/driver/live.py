"""While a command works, its running summary.json says how far each stage got, refreshed every few seconds from
the run's progress actor: `convalue status` and report.html then show "finetune: 22 of 60" instead of a bare
"running" through an hour of fine-tunes."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger("convalue")


@dataclass(frozen=True)
class LivePolicy:
    """How often the running summary is refreshed (seconds; 0: never)."""

    every_s: float = 15.0


class LiveProgress:
    """A driver thread that writes `write(stages)` every policy.every_s with the progress actor's stage states
    (`snapshot()`: its snapshot, or None before Ray is up); stopped, and joined, before the final summary."""

    def __init__(self, snapshot: Callable[[], dict | None], write: Callable[[dict], None],
                 policy: LivePolicy | None = None):
        self.snapshot, self.write, self.policy = snapshot, write, policy or LivePolicy()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="convalue-live-progress", daemon=True)
        self._last: dict | None = None

    def __enter__(self) -> LiveProgress:
        if self.policy.every_s > 0:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """End the refreshes; no write happens after this returns."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _loop(self) -> None:
        while not self._stop.wait(self.policy.every_s):
            try:
                snap = self.snapshot()
                stages = snap.get("stages") if isinstance(snap, dict) else None
                if stages and stages != self._last and not self._stop.is_set():
                    self.write(stages)
                    self._last = {k: dict(v) for k, v in stages.items()}
            except Exception as exc:  # a refresh is a courtesy: the run itself never fails for it
                log.debug("running summary not refreshed: %s", exc)
