"""Progress bars: drawn with counts and an ETA on a terminal, never when stderr is a pipe or a log."""

from __future__ import annotations

import io

from convalue.engine.report.bars import Bars, wanted


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_bars_count_each_stage_on_a_terminal_and_stay_silent_elsewhere():
    screen = Terminal()
    bars = Bars(file=screen)
    assert bars.enabled and wanted(screen) and not wanted(io.StringIO())
    bars.total("featurize", 5)
    bars.advance("featurize", 3)
    bars.total("finetune", 4)
    bars.set("finetune", 2)  # a count read back from the progress actor
    bars.advance("unknown-stage")
    drawn = screen.getvalue()
    assert "featurize" in drawn and "3/5" in drawn and "finetune" in drawn and "2/4" in drawn
    bars.close()
    assert bars.bars == {}
    piped = io.StringIO()
    quiet = Bars(file=piped)
    quiet.total("featurize", 5)
    quiet.advance("featurize", 5)
    assert not quiet.enabled and piped.getvalue() == ""
