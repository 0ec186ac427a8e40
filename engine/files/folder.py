"""RunFolder: a run folder on the local disk or on any pyarrow filesystem (s3://, gs://, hdfs://, a shared mount),
with atomic writes and one writer at a time."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow.fs as pafs

from convalue.engine.files.errors import StoreError
from convalue.engine.files.locks import exclusive, held

#: a lease on a remote run folder is taken over once its holder has not renewed it for this long
LEASE_STALE_S = 300.0
LEASE_RENEW_S = 60.0
LEASE = ".convalue-lock.json"


def is_uri(location: str | Path) -> bool:
    """Whether location names a filesystem by scheme (s3://, gs://, hdfs://, file://, ...) rather than a path."""
    return "://" in str(location)


class RunFolder:
    """A folder of named files on a pyarrow filesystem: local (os.replace makes writes atomic, flock makes one writer)
    or remote (an object appears whole or not at all; one writer by a lease object, best effort)."""

    def __init__(self, fs: pafs.FileSystem, root: str, label: str):
        self.fs, self.root, self.label = fs, root.rstrip("/"), label.rstrip("/")

    @classmethod
    def open(cls, location: str | Path) -> RunFolder:
        """The folder at a local path or a filesystem URI (query options such as endpoint_override pass through)."""
        location = str(location)
        if not is_uri(location):
            path = Path(location).expanduser().absolute()
            return cls(pafs.LocalFileSystem(), str(path), str(path))
        try:
            fs, root = pafs.FileSystem.from_uri(location)
        except (ValueError, OSError) as exc:
            raise StoreError(f"{location}: not a filesystem URI pyarrow can open ({exc})") from None
        label = location.split("?", 1)[0]
        return cls(fs, root, label)

    @classmethod
    def at(cls, out: str | Path, name: str) -> RunFolder:
        """<out>/<name>: a run's folder under its parent `out`."""
        return cls.open(out).sub(name)

    def sub(self, name: str) -> RunFolder:
        """The folder `name` inside this one."""
        return RunFolder(self.fs, f"{self.root}/{name}", f"{self.label}/{name}")

    def __str__(self) -> str:
        return self.label

    def __truediv__(self, name: str) -> str:
        """The label of a file in this folder, for messages."""
        return f"{self.label}/{name}"

    def __reduce__(self):
        return (RunFolder, (self.fs, self.root, self.label))

    @property
    def local(self) -> Path | None:
        """The local path, or None on a remote filesystem."""
        return Path(self.root) if isinstance(self.fs, pafs.LocalFileSystem) else None

    def path(self, name: str = "") -> str:
        """The filesystem path of a file in this folder."""
        return f"{self.root}/{name}" if name else self.root

    def _info(self, name: str) -> pafs.FileInfo:
        return self.fs.get_file_info(self.path(name))

    def exists(self, name: str = "") -> bool:
        """Whether the file or folder exists."""
        return self._info(name).type != pafs.FileType.NotFound

    def is_file(self, name: str) -> bool:
        """Whether name is a file in this folder."""
        return self._info(name).type == pafs.FileType.File

    def is_dir(self, name: str = "") -> bool:
        """Whether name (or this folder) is a folder."""
        return self._info(name).type == pafs.FileType.Directory

    def size(self, name: str) -> int | None:
        """The file's size in bytes (None where it does not exist)."""
        info = self._info(name)
        return info.size if info.type == pafs.FileType.File else None

    def read_bytes(self, name: str) -> bytes:
        """The file's bytes (OSError naming the file where it cannot be read)."""
        try:
            with self.fs.open_input_stream(self.path(name)) as fh:
                return fh.read()
        except FileNotFoundError:
            raise
        except OSError as exc:
            raise OSError(f"{self / name}: cannot be read ({exc})") from None

    def read_text(self, name: str) -> str:
        """The file's text (UTF-8)."""
        return self.read_bytes(name).decode("utf-8")

    def write_bytes(self, name: str, data: bytes) -> None:
        """Write the file atomically: readers see the old file or the new one, never a part."""
        if self.local is not None:
            path = self.local / name
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f"{path.name}.{uuid.uuid4().hex[:8]}.tmp")
            tmp.write_bytes(data)
            os.replace(tmp, path)
            return
        parent = self.path(name).rsplit("/", 1)[0]
        self.fs.create_dir(parent, recursive=True)
        with self.fs.open_output_stream(self.path(name)) as out:  # an object store shows the object once closed
            out.write(data)

    def write_text(self, name: str, text: str) -> None:
        """Write a UTF-8 text file atomically."""
        self.write_bytes(name, text.encode("utf-8"))

    def delete(self, name: str) -> None:
        """Delete a file (absent: nothing)."""
        with contextlib.suppress(FileNotFoundError):
            if self.is_file(name):
                self.fs.delete_file(self.path(name))

    def move(self, name: str, dest: str) -> None:
        """Move a file within this folder (on an object store: copy, then delete)."""
        parent = self.path(dest).rsplit("/", 1)[0]
        self.fs.create_dir(parent, recursive=True)
        self.fs.move(self.path(name), self.path(dest))

    def names(self, sub: str = "") -> list[str]:
        """The names of the files directly in this folder (or its sub-folder `sub`), sorted."""
        try:
            infos = self.fs.get_file_info(pafs.FileSelector(self.path(sub), allow_not_found=True))
        except NotADirectoryError:
            return []
        return sorted(i.base_name for i in infos if i.type == pafs.FileType.File)

    def makedirs(self) -> None:
        """Create this folder (and its parents) if absent."""
        self.fs.create_dir(self.root, recursive=True)

    def writable(self) -> bool:
        """Whether this process may create files here (local folders; a remote one is tried when written)."""
        if self.local is None:
            return True
        existing = next(q for q in (self.local, *self.local.parents) if q.exists())
        return os.access(existing, os.W_OK | os.X_OK)

    @contextlib.contextmanager
    def lock(self, busy: Callable[[], Exception]) -> Iterator[None]:
        """Hold the folder for one writer: flock locally; on a remote filesystem a lease object renewed while held
        (best effort: object stores offer no atomic create-if-absent here, so two writers starting in the same
        moment are not told apart; one starting while a fresh lease exists is refused)."""
        if self.local is not None:
            with exclusive(self.local, busy=busy):
                yield
            return
        owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        lease = self._lease()
        if lease is not None and lease.get("owner") != owner and time.time() - lease.get("renewed", 0) < LEASE_STALE_S:
            raise busy()
        stop = threading.Event()

        def renew() -> None:
            while not stop.wait(LEASE_RENEW_S):
                self.write_text(LEASE, json.dumps({"owner": owner, "renewed": time.time()}))

        self.write_text(LEASE, json.dumps({"owner": owner, "renewed": time.time()}))
        thread = threading.Thread(target=renew, daemon=True, name="convalue-lease")
        thread.start()
        try:
            yield
        finally:
            stop.set()
            self.delete(LEASE)

    def _lease(self) -> dict | None:
        try:
            lease = json.loads(self.read_text(LEASE))
        except (FileNotFoundError, OSError, ValueError):
            return None
        return lease if isinstance(lease, dict) else None

    def held(self) -> bool:
        """Whether another process holds the folder now (a flock locally, a fresh lease remotely)."""
        if self.local is not None:
            return self.local.is_dir() and held(self.local)
        lease = self._lease()
        return lease is not None and time.time() - lease.get("renewed", 0) < LEASE_STALE_S


def file_location(location: str | Path) -> tuple[RunFolder, str]:
    """(the folder, the file name) of a file given as a local path or a filesystem URI (query options kept)."""
    location = str(location)
    if not is_uri(location):
        path = Path(location).expanduser().absolute()
        return RunFolder.open(path.parent), path.name
    base, _, query = location.partition("?")
    parent, _, name = base.rpartition("/")
    return RunFolder.open(parent + (f"?{query}" if query else "")), name


def as_folder(location: RunFolder | str | Path) -> RunFolder:
    """A RunFolder for a folder given as one, as a local path or as a filesystem URI."""
    return location if isinstance(location, RunFolder) else RunFolder.open(location)
