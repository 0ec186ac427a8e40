"""Data files beside JSON Lines and Parquet: JSON, CSV and the gzip of each text format, read in batches, with errors
that name the file, the line or row, and the field (real chatterbot text)."""

from __future__ import annotations

import csv
import gzip
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import chatterbot_pairs, write_jsonl

from convalue.engine.config import SourceConfig
from convalue.engine.data import files
from convalue.engine.data.examples import DataError
from convalue.engine.data.files import read_rows
from convalue.engine.data.sources import load_source


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    """12 real pairs in two groups, one prompt that looks like a number (CSV must keep it text)."""
    out = [r | {"g": lang} for lang in ("english", "spanish") for r in chatterbot_pairs(lang, 6)]
    out[3] = out[3] | {"prompt": "42"}
    return out


def write_csv(path: Path, rows: list[dict], opener=open) -> Path:
    with opener(path, "wt", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return path


def write_all_formats(folder: Path, rows: list[dict]) -> dict[str, Path]:
    """The same rows as every supported file type."""
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    array = json.dumps(rows, ensure_ascii=False, indent=2)
    out = {"jsonl": write_jsonl(folder / "a.jsonl", rows), "json": folder / "b.json", "lines": folder / "c.json",
           "csv": write_csv(folder / "d.csv", rows), "parquet": folder / "e.parquet",
           "jsonl.gz": folder / "f.jsonl.gz", "json.gz": folder / "g.json.gz",
           "csv.gz": write_csv(folder / "h.csv.gz", rows, gzip.open)}
    out["json"].write_text(array, encoding="utf-8")
    out["lines"].write_text(text, encoding="utf-8")
    pq.write_table(pa.Table.from_pylist(rows), out["parquet"])
    out["jsonl.gz"].write_bytes(gzip.compress(text.encode()))
    out["json.gz"].write_bytes(gzip.compress(array.encode()))
    return out


def test_every_format_gives_the_same_groups(tmp_path, rows):
    paths = write_all_formats(tmp_path, rows)
    expected = load_source(SourceConfig(kind="jsonl", path=str(paths["jsonl"]), group_by="g"))
    assert sorted(expected) == ["english", "spanish"]
    for name, path in paths.items():
        kind = name.split(".")[0] if name != "lines" else "json"
        groups = load_source(SourceConfig(kind=kind, path=str(path), group_by="g"))
        assert {k: g.examples for k, g in groups.items()} == {k: g.examples for k, g in expected.items()}, name
    assert [r for _, r in read_rows(paths["csv"])][3]["prompt"] == "42"  # text, as written


def test_a_folder_reads_every_format_and_names_groups_without_suffixes(tmp_path, rows):
    write_all_formats(tmp_path, rows[:4])
    (tmp_path / "notes.txt").write_text("not data")
    groups = load_source(SourceConfig(kind="folder", path=str(tmp_path)))
    assert sorted(groups) == list("abcdefgh")
    assert all(len(g.examples) == 4 for g in groups.values())
    assert groups["f"].origin == str(tmp_path / "f.jsonl.gz")
    write_csv(tmp_path / "a.csv", rows[:2])
    with pytest.raises(DataError, match="two files make the group 'a'"):
        load_source(SourceConfig(kind="folder", path=str(tmp_path)))


def test_a_flat_pool_file_is_named_without_its_suffixes(tmp_path, rows):
    from convalue.engine.data.sources import source_label

    assert source_label(SourceConfig(kind="csv", path=str(tmp_path / "pool.csv.gz"))) == "pool"
    assert source_label(SourceConfig(kind="json", path=str(tmp_path / "my.pool.json"))) == "my.pool"


def test_files_are_read_in_batches_not_whole(tmp_path, rows, monkeypatch):
    """A JSON array is parsed item by item from small reads, a CSV block by block: the first rows arrive before a
    damaged tail is read, and a column that looks numeric in the first block stays text in later ones."""
    monkeypatch.setattr(files, "CHUNK_CHARS", 16)
    monkeypatch.setattr(files, "CSV_BLOCK_BYTES", 256)
    array = tmp_path / "big.json"
    array.write_text(json.dumps(rows, indent=1)[:-1] + ', {"prompt": oops}]', encoding="utf-8")
    stream = read_rows(array)
    where, first = next(stream)
    assert first == rows[0] and where == f"{array}:2"
    got = [first]
    with pytest.raises(DataError, match=rf"big.json:{json.dumps(rows, indent=1).count(chr(10)) + 1}: invalid JSON"):
        for _, row in stream:
            got.append(row)
    assert got == rows
    numbers = [{"prompt": str(i), "response": "r"} for i in range(200)] + [{"prompt": "text", "response": "r"}]
    path = write_csv(tmp_path / "n.csv", numbers)
    assert [r for _, r in read_rows(path)] == numbers
    path.write_text(path.read_text() + "a,b,c\n")
    stream = read_rows(path)
    assert next(stream)[1] == numbers[0]
    with pytest.raises(DataError, match=r"n.csv: not a readable CSV file .*Expected 2 columns, got 3"):
        list(stream)


def test_errors_name_the_file_the_row_and_the_field(tmp_path, rows):
    cases = []
    bad = [{"prompt": "a", "response": "b"}, {"prompt": "c", "answer": "d"}]
    array = tmp_path / "bad.json"
    array.write_text(json.dumps(bad, indent=1))
    cases.append((array, "json", r"bad.json:6: missing field\(s\) \['response'\]"))
    path = write_csv(tmp_path / "bad.csv", [{"prompt": "a", "answer": "b"}])
    cases.append((path, "csv", r"bad.csv row 1: missing field\(s\) \['response'\]"))
    path = tmp_path / "bad.parquet"
    pq.write_table(pa.Table.from_pylist([{"prompt": "a", "response": "b"}, {"prompt": "c", "response": None}]), path)
    cases.append((path, "parquet", r"bad.parquet row 1: missing field\(s\) \['response'\]"))
    path = write_csv(tmp_path / "chat.csv", [{"messages": json.dumps([{"role": "user", "content": "hi"},
                                                                      {"role": "assistant", "content": "yo"}])},
                                             {"messages": "[{'role': 'user'}]"}])
    cases.append((path, "csv", r"chat.csv row 2: `messages` is text but not JSON"))
    path = tmp_path / "types.json"
    path.write_text(json.dumps([{"prompt": "a", "response": 7}]))
    cases.append((path, "json", r"types.json:1: field 'response' must be a string, got int 7"))
    path = tmp_path / "notgz.jsonl.gz"
    path.write_text('{"prompt": "a", "response": "b"}\n')
    cases.append((path, "jsonl", r"notgz.jsonl.gz: not a gzip file, though its name says so \(Not a gzipped file"))
    path = tmp_path / "cut.csv.gz"
    data = gzip.compress("".join(f"{i} {r['prompt']},{i} {r['response']}\n" for i, r in enumerate(rows * 40))
                         .encode())
    path.write_bytes(gzip.compress(b"prompt,response\n") + data[: len(data) // 2])
    cases.append((path, "csv", r"cut.csv.gz: truncated or corrupt gzip file \(it ends before its end-of-stream marker"))
    path = tmp_path / "scalar.json"
    path.write_text('[{"prompt": "a", "response": "b"}, 3]')
    cases.append((path, "json", r"scalar.json:1: each row must be a JSON object, got int"))
    for path, kind, message in cases:
        with pytest.raises(DataError, match=message):
            load_source(SourceConfig(kind=kind, path=str(path)))
