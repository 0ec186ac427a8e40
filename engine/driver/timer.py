"""The stage timer: wall time per named stage, logged, and reported to the run's progress actor once Ray is up (no
Ray imported: `convalue score` times a valuation certified in the driver with it)."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the progress bars and actor handle, which import Ray
    from convalue.actors.progress import Progress

log = logging.getLogger("convalue")


class Timer:
    """Wall time per named stage, logged, and reported to the run's progress actor once Ray is up."""

    def __init__(self, progress: Callable[[], Progress | None] = lambda: None) -> None:
        self.seconds: dict[str, float] = {}
        self.progress = progress

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Time the with-block as stage `name`."""
        t0 = time.perf_counter()
        log.info("stage %s ...", name)
        if (p := self.progress()) is not None:
            p.begin(name)
        try:
            yield
        finally:
            took = time.perf_counter() - t0
            # summed where a stage is entered again (a valuation tried in the driver, then on the cluster)
            self.seconds[name] = round(self.seconds.get(name, 0.0) + took, 3)
            log.info("stage %s done in %.1f s", name, took)
            if (p := self.progress()) is not None:
                p.end(name, round(took, 3))
