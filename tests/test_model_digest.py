"""A model folder's content hash: it follows the weights, config and tokenizer, and is cached by size and mtime."""

from __future__ import annotations

import os
import shutil

from convalue.engine.model.digest import model_digest, model_files


def test_the_digest_follows_the_weights_not_the_folder(tiny_model_dir, tmp_path):
    cache = tmp_path / "digests"
    a = model_digest(tiny_model_dir, cache)
    assert a == model_digest(tiny_model_dir, cache)
    names = {p.name for p in model_files(tiny_model_dir)}
    assert {"model.safetensors", "config.json", "tokenizer.json"} <= names
    moved = shutil.copytree(tiny_model_dir, tmp_path / "moved")
    assert model_digest(moved, cache) == a  # another folder with the same files: the same model
    weights = moved / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF  # one byte of the weights changed
    weights.write_bytes(bytes(data))
    assert model_digest(moved, cache) != a
    (moved / "tokenizer.json").write_text((moved / "tokenizer.json").read_text().replace("<|im_start|>", "<|x|>"))
    assert len({a, model_digest(moved, cache)}) == 2


def test_a_file_is_hashed_again_only_when_its_size_or_mtime_changes(tiny_model_dir, tmp_path):
    cache = tmp_path / "digests"
    folder = shutil.copytree(tiny_model_dir, tmp_path / "m")
    before = model_digest(folder, cache)
    weights = folder / "model.safetensors"
    st = weights.stat()
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns))  # same size and mtime: the cached hash stands
    assert model_digest(folder, cache) == before
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns + 1))  # a new mtime: hashed again
    assert model_digest(folder, cache) != before
