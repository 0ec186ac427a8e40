"""report.html written beside a command's result: a view of the run record, rendered from the folder."""

from __future__ import annotations

import logging

from convalue.engine.files.folder import RunFolder
from convalue.engine.report.html import render_report
from convalue.engine.store.record import RunRecord

log = logging.getLogger("convalue")


def write_view(record: RunRecord, folder: RunFolder) -> None:
    """report.html of the folder holding the attempt's result; a failure here never hides the command's own."""
    try:
        record.write_view(folder, render_report(folder))
    except Exception as exc:  # the page is a view of the record: the record stands without it
        log.warning("report.html not written: %s", exc)
