"""Rows of data files, read in batches: JSON Lines, JSON (an array of objects, or JSON Lines), CSV and Parquet, the
text formats also gzipped. Every row comes with where it is (`file:line`, `file row i`) for error messages."""

from __future__ import annotations

import gzip
import io
import json
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from convalue.engine.config.sources import file_format
from convalue.engine.data.examples import DataError

Rows = Iterator[tuple[str, dict]]
#: rows per Parquet batch, bytes per CSV block, characters per read of a JSON array
BATCH_ROWS = 4096
CSV_BLOCK_BYTES = 1 << 22
CHUNK_CHARS = 1 << 20
_SPACE = " \t\r\n"
_DECODER = json.JSONDecoder()


def _open(path: Path, gz: bool) -> IO[bytes]:
    return gzip.open(path, "rb") if gz else path.open("rb")


def _object(row: object, where: str) -> dict:
    if not isinstance(row, dict):
        raise DataError(f"{where}: each row must be a JSON object, got {type(row).__name__}")
    return row


def _json_lines(fh: IO[bytes], path: Path, first: int = 1) -> Rows:
    """(where, row) of a JSON Lines stream, one object a line (a byte-order mark tolerated on the first)."""
    for i, raw in enumerate(fh, first):
        try:
            line = raw.decode("utf-8-sig" if i == 1 else "utf-8")
        except UnicodeDecodeError as exc:
            raise DataError(f"{path}:{i}: not UTF-8 text (byte {raw[exc.start]:#04x} at column {exc.start + 1}); "
                            "save the file as UTF-8") from None
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}:{i}: invalid JSON ({exc.msg})") from None
        if not isinstance(row, dict):
            raise DataError(f"{path}:{i}: each line must be a JSON object, got {type(row).__name__}")
        yield f"{path}:{i}", row


class _Text:
    """A text stream read in chunks, with a cursor and the line number at it."""

    def __init__(self, fh: IO[str], path: Path):
        self.fh, self.path, self.buf, self.pos, self.line = fh, path, "", 0, 1

    def _more(self) -> bool:
        try:
            chunk = self.fh.read(CHUNK_CHARS)
        except UnicodeDecodeError as exc:
            raise DataError(f"{self.path}: not UTF-8 text (byte {exc.object[exc.start]:#04x} after line "
                            f"{self.line}); save the file as UTF-8") from None
        self.buf = self.buf[self.pos:] + chunk
        self.pos = 0
        return bool(chunk)

    def peek(self) -> str:
        """The next character that is not white space ('' at the end), without taking it."""
        while True:
            while self.pos < len(self.buf) and self.buf[self.pos] in _SPACE:
                self.line += self.buf[self.pos] == "\n"
                self.pos += 1
            if self.pos < len(self.buf) or not self._more():
                return self.buf[self.pos:self.pos + 1]

    def take(self) -> None:
        """Step over the character peek() returned."""
        self.pos += 1

    def value(self) -> object:
        """The JSON value at the cursor (reading on while it is cut by the chunk's end)."""
        while True:
            try:
                obj, end = _DECODER.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as exc:
                if self._more():
                    continue
                line = self.line + self.buf.count("\n", self.pos, exc.pos)
                raise DataError(f"{self.path}:{line}: invalid JSON ({exc.msg})") from None
            if end == len(self.buf) and self._more():  # a number or literal may go on in the next chunk
                continue
            self.line += self.buf.count("\n", self.pos, end)
            self.pos = end
            return obj


def _json_array(text: _Text) -> Rows:
    """(where, row) of the objects of a JSON array, one at a time."""
    text.take()  # "["
    if text.peek() == "]":
        text.take()
    else:
        while True:
            text.peek()
            where = f"{text.path}:{text.line}"
            yield where, _object(text.value(), where)
            c = text.peek()
            text.take()
            if c == "]":
                break
            if c != ",":
                raise DataError(f"{text.path}:{text.line}: invalid JSON (expected ',' or ']' after an array item)")
    if text.peek():
        raise DataError(f"{text.path}:{text.line}: invalid JSON (extra data after the array)")


def _first_char(path: Path, gz: bool) -> bytes:
    """The file's first byte that is not white space or a byte-order mark (b"" for an empty file)."""
    with _open(path, gz) as fh:
        head = fh.read(3).removeprefix(b"\xef\xbb\xbf")
        while True:
            head = head.lstrip()
            if head:
                return head[:1]
            head = fh.read(CHUNK_CHARS)
            if not head:
                return b""


def _json(path: Path, gz: bool) -> Rows:
    """A .json file: an array of objects (read item by item) or JSON Lines."""
    if _first_char(path, gz) != b"[":
        yield from _jsonl(path, gz)
        return
    with _open(path, gz) as fh:
        text = _Text(io.TextIOWrapper(fh, encoding="utf-8-sig"), path)
        text.peek()
        yield from _json_array(text)


def _jsonl(path: Path, gz: bool) -> Rows:
    with _open(path, gz) as fh:
        yield from _json_lines(fh, path)


def _csv(path: Path, gz: bool) -> Rows:
    """A CSV file with a header row, every column read as text, in batches (`file row i`: the i-th row after the
    header, from 1)."""
    blocks = pacsv.ReadOptions(block_size=CSV_BLOCK_BYTES)
    try:
        with _open(path, gz) as fh:  # decompressed here: pyarrow guesses compression from a path's name only
            names = pacsv.open_csv(fh, read_options=blocks).schema.names
        # every column as text: a type inferred from the first block would refuse a later block's values
        as_text = pacsv.ConvertOptions(column_types={n: pa.string() for n in names}, strings_can_be_null=False)
        with _open(path, gz) as fh:
            i = 0
            for batch in pacsv.open_csv(fh, read_options=blocks, convert_options=as_text):
                for row in batch.to_pylist():
                    i += 1
                    yield f"{path} row {i}", row
    except pa.ArrowInvalid as exc:
        raise DataError(f"{path}: not a readable CSV file ({exc})") from None


def _parquet(path: Path, gz: bool) -> Rows:
    """A Parquet file, one row group batch at a time (`file row i`, from 0)."""
    try:
        pf = pq.ParquetFile(path)
        i = 0
        for batch in pf.iter_batches(batch_size=BATCH_ROWS):
            for row in batch.to_pylist():
                yield f"{path} row {i}", row
                i += 1
    except OSError:
        raise
    except Exception as exc:  # pyarrow raises several types for unreadable files
        raise DataError(f"{path}: not a readable Parquet file ({exc})") from None


READERS: dict[str, Callable[[Path, bool], Rows]] = {"jsonl": _jsonl, "json": _json, "csv": _csv,
                                                    "parquet": _parquet}


def read_rows(path: Path, kind: str | None = None) -> Rows:
    """(where, row) for every row of a data file, its format from its name (else `kind`), read in batches; an
    unreadable or malformed file is a DataError naming it (and the line or row)."""
    fmt, gz = file_format(path)
    fmt = fmt or kind
    if fmt not in READERS:
        raise DataError(f"{path}: unsupported file type (use .jsonl, .json, .csv or .parquet, or the first three "
                        "gzipped: .jsonl.gz, ...)")
    try:
        yield from READERS[fmt](path, gz)
    except DataError:
        # damaged gzip data can decompress to text that fails to parse before the stream's own check fails
        if gz and (why := _gzip_damage(path)) is not None:
            raise DataError(f"{path}: truncated or corrupt gzip file ({why})") from None
        raise
    except (EOFError, zlib.error, gzip.BadGzipFile) as exc:  # a truncated stream is an EOFError
        if str(exc).startswith("Not a gzipped file"):
            raise DataError(f"{path}: not a gzip file, though its name says so ({exc})") from None
        raise DataError(f"{path}: truncated or corrupt gzip file ({_gzip_reason(exc)})") from None
    except OSError as exc:
        detail = getattr(exc, "strerror", None) or exc
        raise DataError(f"{path}: cannot be read ({detail})") from None


def _gzip_reason(exc: BaseException) -> str:
    """What a damaged gzip stream's exception says, the truncation put plainly."""
    if isinstance(exc, EOFError):
        return "it ends before its end-of-stream marker: the file was cut short"
    return " ".join(str(exc).split()) or type(exc).__name__


def _gzip_damage(path: Path) -> str | None:
    """Why a gzip file's stream is damaged, read through to its end (the CRC and length checked); None when whole."""
    try:
        with gzip.open(path, "rb") as fh:
            while fh.read(CSV_BLOCK_BYTES):
                pass
    except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
        return _gzip_reason(exc)
    except OSError:
        return None  # unreadable, not damaged: the error already raised says so
    return None
