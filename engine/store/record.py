"""The run record: the one owner of a run folder. It resolves the folder once from `(out, name)`, writes every
artifact (atomically, with its checksum and size in the summary's manifest) and the summary, and swaps a re-run's
results in only when the re-run is complete."""

from __future__ import annotations

from convalue.engine.files.folder import RunFolder


def run_folder_of(out: str, name: str) -> RunFolder:
    """The run folder `<out>/<name>` (a local path or a filesystem URI): the one place a run's folder is derived."""
    return RunFolder.at(out, name)
