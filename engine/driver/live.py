"""While a command on a config works (`run`, `faithfulness`, `transfer`), its running summary.json says how far
each stage got, refreshed from the run's progress actor once Ray is up and whenever the counts moved: `convalue
status` then shows "finetune: 22 of 60 so far" instead of a bare "running" through an hour of fine-tunes."""

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
        self._writing = threading.Lock()  # held around each write: stop() waits for one under way, then no more
        self._thread = threading.Thread(target=self._loop, name="convalue-live-progress", daemon=True)
        self._last: dict | None = None

    def __enter__(self) -> LiveProgress:
        if self.policy.every_s > 0:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """End the refreshes; no write happens after this returns (a signal cannot cut it short the way it can a
        thread's join: the lock is taken after the flag is set, so a write under way ends first and none follows)."""
        self._stop.set()
        with self._writing:
            pass
        if self._thread.is_alive():  # let a snapshot under way end before Ray shuts down (at most its timeout)
            self._thread.join(timeout=30)

    def _loop(self) -> None:
        while not self._stop.wait(self.policy.every_s):
            try:
                snap = self.snapshot()
                stages = snap.get("stages") if isinstance(snap, dict) else None
                with self._writing:
                    if self._stop.is_set():
                        return
                    if stages and stages != self._last:
                        self.write(stages)
                        self._last = {k: dict(v) for k, v in stages.items()}
            except Exception as exc:  # a refresh is a courtesy: the run itself never fails for it
                log.debug("running summary not refreshed: %s", exc)
