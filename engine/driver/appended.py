"""Which leading row groups of a vectors Parquet an earlier import already holds: a row group whose bytes (and the
file's schema) are those imported before holds the same rows, so a grown file is decoded from its first changed
row group on (`convalue score` with rows appended)."""

from __future__ import annotations

import hashlib
import os
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
import pyarrow.parquet as pq

from convalue.engine.files.errors import StoreError
from convalue.engine.files.folder import RunFolder


def row_group_digests(folder: RunFolder, name: str) -> list[list]:
    """[[SHA-256 of the row group's bytes and the file's schema, rows], ...] of a Parquet file, reading the bytes
    of each row group once (no decoding); row groups are hashed in parallel threads (hashlib and the reads release
    the GIL: the hash of a large unchanged file is what an append waits for)."""
    with folder.fs.open_input_file(folder.path(name)) as fh:
        try:
            meta = pq.ParquetFile(fh).metadata
        except (pa.ArrowException, OSError) as exc:  # named as the import's own reader names it
            raise StoreError(f"{folder / name}: not a Parquet file ({exc})") from None
    schema = str(meta.schema).split("\n", 1)[-1].encode()  # its first line names the Python object
    spans = []
    for i in range(meta.num_row_groups):
        rg = meta.row_group(i)
        cols = [rg.column(j) for j in range(rg.num_columns)]
        starts = [c.dictionary_page_offset if c.has_dictionary_page else c.data_page_offset for c in cols]
        spans.append((min(starts), max(s + c.total_compressed_size for s, c in zip(starts, cols)), rg.num_rows))

    def digest(span: tuple[int, int, int]) -> list:
        start, end, rows = span
        h = hashlib.sha256(schema)
        with folder.fs.open_input_file(folder.path(name)) as fh:
            fh.seek(start)
            for lo in range(start, end, 1 << 24):
                h.update(fh.read(min(1 << 24, end - lo)))
        return [h.hexdigest(), rows]

    with ThreadPoolExecutor(max_workers=max(1, min(len(spans), os.cpu_count() or 1, 8))) as pool:
        return list(pool.map(digest, spans))


def leading_unchanged(digests: list[list], before: list | None) -> int:
    """How many leading row groups are those imported before (digest and rows)."""
    k = 0
    for now, then in zip(digests, before or []):
        if list(now) != list(then):
            break
        k += 1
    return k
