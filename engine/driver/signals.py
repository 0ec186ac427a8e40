"""SIGTERM and SIGINT as an exception the run records: the summary names the signal, the process exits with the
conventional 128 + signal number (143, 130), and a second signal while the run cleans up is ignored."""

from __future__ import annotations

import logging
import signal
import threading
from types import FrameType

log = logging.getLogger("convalue")
SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Interrupted(BaseException):
    """The process received SIGTERM or SIGINT (a BaseException, like KeyboardInterrupt: no `except Exception`
    swallows it)."""

    def __init__(self, signum: int):
        self.signum = signum
        self.name = signal.Signals(signum).name
        super().__init__(f"stopped by {self.name}")

    @property
    def exit_code(self) -> int:
        """128 + the signal number, as a shell reports a process the signal ended."""
        return 128 + self.signum


class _Handler:
    """Raise Interrupted on the first signal; log and ignore the ones that arrive while the run cleans up."""

    def __init__(self) -> None:
        self.received: Interrupted | None = None

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if self.received is not None:
            log.warning("%s received while stopping after %s: ignored (the run folder is being closed)",
                        signal.Signals(signum).name, self.received.name)
            return
        self.received = Interrupted(signum)
        log.warning("%s received: stopping the run", self.received.name)
        raise self.received


_HANDLER = _Handler()


def received() -> Interrupted | None:
    """The signal that stopped this process's run, if one did. Raised inside a Ray call, Interrupted can reach the
    caller wrapped (a SystemError from Ray's Cython layer), so callers ask here rather than match the exception."""
    return _HANDLER.received


def install() -> None:
    """Route SIGTERM and SIGINT to Interrupted (from the main thread only; ray.init replaces the SIGTERM handler,
    so the driver installs this again once Ray is up)."""
    if threading.current_thread() is threading.main_thread():
        for sig in SIGNALS:
            signal.signal(sig, _HANDLER)
