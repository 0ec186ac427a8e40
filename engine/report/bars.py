"""Progress bars with an ETA on a terminal (tqdm), one per stage that has items to count; nothing (the log lines
stay) when stderr is not a terminal, as in a Ray job, a pipe or a CI log."""

from __future__ import annotations

import sys
from typing import Any

from tqdm.auto import tqdm

#: the stages a bar is drawn for, with the unit counted
UNITS = {"embed": "chunk", "featurize": "group", "bootstrap": "resample", "finetune": "fine-tune"}


def wanted(stream: Any = None) -> bool:
    """Whether bars should be drawn: stderr is an interactive terminal (and tqdm is installed)."""
    stream = stream if stream is not None else sys.stderr
    try:
        import tqdm  # noqa: F401
    except ImportError:
        return False
    return bool(getattr(stream, "isatty", lambda: False)())


class Bars:
    """One tqdm bar per stage, created when the stage's total is known, moved by advance() or set to a count."""

    def __init__(self, enabled: bool | None = None, file: Any = None):
        self.enabled = wanted(file) if enabled is None else enabled
        self.file = file
        self.bars: dict[str, Any] = {}

    def total(self, stage: str, n: int) -> None:
        """The stage has n items: open (or resize) its bar."""
        if not self.enabled or stage not in UNITS:
            return

        if stage in self.bars:
            self.bars[stage].total = n
            self.bars[stage].refresh()
        else:
            self.bars[stage] = tqdm(total=n, desc=stage, unit=UNITS[stage], dynamic_ncols=True, leave=True,
                                    file=self.file, mininterval=0)

    def advance(self, stage: str, n: int = 1) -> None:
        """n more items of the stage are done."""
        if stage in self.bars and n:
            self.bars[stage].update(n)

    def set(self, stage: str, done: int) -> None:
        """The stage has `done` items done (a count read back from the progress actor)."""
        if stage in self.bars and done != self.bars[stage].n:
            self.bars[stage].update(done - self.bars[stage].n)

    def close(self, stage: str | None = None) -> None:
        """Close one stage's bar (None: every bar)."""
        for name in [stage] if stage else list(self.bars):
            bar = self.bars.pop(name, None)
            if bar is not None:
                bar.close()
