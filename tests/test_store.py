"""The vector store and the run folder: blocks committed by their sidecar, resume, damage set aside, manifest
consolidated, on a local disk and on a real S3-compatible server (moto) through pyarrow."""

from __future__ import annotations

import json

import numpy as np
import pytest

from convalue.engine.files.errors import StoreError
from convalue.engine.files.folder import RunFolder
from convalue.engine.store.vectors import VectorStore, read_manifest, verify_blocks, write_block

FP = {"model": "m", "projection": {"kind": "countsketch", "dim": 4, "seed": 0}}


@pytest.fixture(params=["local", "s3"])
def folder(request, tmp_path) -> RunFolder:
    if request.param == "local":
        return RunFolder.open(tmp_path / "v")
    return RunFolder.at(request.getfixturevalue("s3_base"), f"v-{tmp_path.name}")


def test_round_trip_resume_and_per_example_vectors(folder):
    s = VectorStore(folder, FP)
    per = [np.full((2, 4), i, dtype=np.float32) for i in range(3)]
    s.write_block(["a", "b"], ["ka", "kb"], [2, 2], [20, 20], np.stack([x.mean(0) for x in per[:2]]), per[:2])
    s.write_block(["c"], ["kc"], [2], [20], per[2][:1], per[2:])
    again = VectorStore(folder, FP)
    assert again.done() == {"a": "ka", "b": "kb", "c": "kc"}
    Y, counts = again.load(["c", "a"])
    np.testing.assert_array_equal(Y, [[2] * 4, [0] * 4])
    assert counts == {"c": 2, "a": 2}
    np.testing.assert_array_equal(again.load_examples(["b"])["b"], per[1])
    assert verify_blocks(folder, read_manifest(folder)) == []
    assert folder.is_file("manifest.json") and not folder.exists(".convalue-lock.json")


def test_a_block_committed_by_its_sidecar_is_found_without_the_manifest(folder):
    """A worker writes its block and sidecar; the driver had not rewritten the manifest when the run stopped."""
    VectorStore(folder, FP)
    meta = write_block(folder, ["a"], ["ka"], [1], [1], np.ones((1, 4)))
    assert read_manifest(folder)["blocks"] == []
    assert VectorStore(folder, FP).done() == {"a": "ka"}
    folder.write_bytes("block-half.parquet", b"PAR1 cut short")  # a block whose sidecar never came
    assert any("no sidecar commits it" in p for p in verify_blocks(folder, read_manifest(folder)))
    assert VectorStore(folder, FP).done() == {"a": "ka"} and meta.file in read_manifest(folder)["blocks"][0]["file"]


def test_damage_is_set_aside_and_recomputed_not_read(folder):
    s = VectorStore(folder, FP)
    a = s.write_block(["a"], ["ka"], [1], [1], np.ones((1, 4)))
    b = s.write_block(["b"], ["kb"], [1], [1], np.full((1, 4), 2.0))
    s.mark_complete(["a", "b"])
    data = bytearray(folder.read_bytes(b.file))
    data[len(data) // 2] ^= 0xFF  # same size: found when read (or by status), not at opening
    folder.write_bytes(b.file, bytes(data))
    folder.write_bytes(a.file, folder.read_bytes(a.file)[:-5])  # cut short: found at opening
    assert len(verify_blocks(folder, read_manifest(folder))) == 2
    assert len(verify_blocks(folder, read_manifest(folder), quick=True)) == 1  # quick does not hash
    reopened = VectorStore(folder, FP)
    assert reopened.done() == {"b": "kb"} and reopened.dropped == [a.file]
    assert not read_manifest(folder).get("complete")
    with pytest.raises(StoreError, match=rf"{b.file}: checksum mismatch.*set aside"):
        reopened.load(["b"])
    assert folder.sub("damaged").names() == sorted([a.file, a.sidecar, b.file, b.sidecar])
    assert VectorStore(folder, FP).done() == {}


def test_other_settings_or_a_damaged_manifest_are_refused_unless_overwritten(folder):
    VectorStore(folder, FP).write_block(["a"], ["k"], [1], [1], np.ones((1, 4)))
    other = FP | {"projection": {"kind": "countsketch", "dim": 4, "seed": 1}}
    with pytest.raises(StoreError, match=r"differs in \['projection'\]"):
        VectorStore(folder, other)
    assert VectorStore(folder, other, overwrite=True).done() == {}
    assert read_manifest(folder)["fingerprint"]["projection"]["seed"] == 1
    folder.write_text("manifest.json", "{oops")
    with pytest.raises(StoreError, match=r"manifest.json: not readable JSON.*--overwrite to start it afresh"):
        VectorStore(folder, FP)
    assert VectorStore(folder, FP, overwrite=True).done() == {} and read_manifest(folder)["fingerprint"] == FP


def test_a_reader_changes_nothing(folder):
    s = VectorStore(folder, FP)
    s.write_block(["a"], ["ka"], [1], [1], np.ones((1, 4)))
    s.mark_complete(["a"])
    before = folder.read_bytes("manifest.json")
    np.testing.assert_array_equal(VectorStore.reader(folder).load(["a"])[0], np.ones((1, 4)))
    assert folder.read_bytes("manifest.json") == before


def test_non_finite_vectors_are_refused(folder):
    with pytest.raises(StoreError, match="non-finite"):
        VectorStore(folder, {"x": 1}).write_block(["a"], ["k"], [1], [1], np.array([[np.nan, 1.0]]))


def test_a_remote_run_folder_has_one_writer_by_lease(s3_base):
    folder = RunFolder.at(s3_base, "leased")

    def busy():
        return StoreError("busy")

    with folder.lock(busy):
        assert folder.held() and json.loads(folder.read_text(".convalue-lock.json"))["owner"]
        with pytest.raises(StoreError, match="busy"), folder.lock(busy):
            pass
    assert not folder.held() and not folder.exists(".convalue-lock.json")
