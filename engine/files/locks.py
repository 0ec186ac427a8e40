"""Exclusive locks between processes (flock): a run folder while it is written, a lock file around a conversion."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path

from convalue.engine.files.errors import StoreError

log = logging.getLogger("convalue")


@contextlib.contextmanager
def exclusive(path: Path, *, busy: Callable[[], Exception] | None = None) -> Iterator[None]:
    """Hold an exclusive flock on path (an existing folder, or a lock file made here) for the with-block.

    Without `busy` it waits for the holder; with it, it raises busy() at once where another process holds the
    lock. On a file system without flock (some network mounts) it logs that and goes on unguarded.
    """
    path = Path(path)
    if path.is_dir():
        fd = os.open(path, os.O_RDONLY)
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (fcntl.LOCK_NB if busy else 0))
        except BlockingIOError:
            raise busy() from None
        except OSError as exc:
            log.warning("%s: cannot lock (%s); do not run two convalue processes on it at once", path, exc)
        yield
    finally:
        os.close(fd)  # releases the lock


class _Held(Exception):
    """Raised by held()'s probe where another process holds the lock."""


def held(path: Path) -> bool:
    """Whether another process holds the flock on path (an existing folder) now; False where flock is missing."""
    try:
        with exclusive(path, busy=_Held):  # taken and released at once where free
            return False
    except _Held:
        return True


def run_folder_lock(run_dir) -> contextlib.AbstractContextManager:
    """The run folder's lock (a RunFolder), refused at once (StoreError) while another run or re-solve holds it."""
    return run_dir.lock(busy=lambda: StoreError(
        f"{run_dir}: in use by another convalue process (a run or a re-solve); wait for it to finish, "
        "or use another run name/--out"))
