"""Projection (seeded, unbiased), the vector store (checksums, resume, mismatch) and blocked Gram reduction."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from convalue.engine.features.projection import ProjectionError, make_projector
from convalue.engine.selection.gram import GramReducer, cosine
from convalue.engine.store.vectors import StoreError, VectorStore, read_manifest


@pytest.mark.parametrize("kind", ["countsketch", "rademacher", "gaussian"])
def test_inner_products_preserved_in_expectation(kind):
    rng = np.random.default_rng(0)
    d, p = 2000, 64
    x, y = rng.normal(size=d), rng.normal(size=d)
    y = 0.6 * x + 0.8 * y  # correlated pair
    est = []
    for seed in range(300):
        P = make_projector(kind, d, p, seed)
        px, py = P.project(np.stack([x, y]))
        est.append(float(px @ py))
    exact = float(x @ y)
    se = np.std(est) / np.sqrt(len(est))
    assert abs(np.mean(est) - exact) < 4 * se
    assert np.std(est) < abs(exact)  # single draws are informative at p = 64


def test_identity_is_exact_and_bad_dims_raise():
    X = np.arange(12, dtype=np.float32).reshape(2, 6)
    assert np.array_equal(make_projector("identity", 6, 6, 0).project(X), X)
    with pytest.raises(ProjectionError, match="projection.dim must be > 0"):
        make_projector("countsketch", 10, 0, 0)
    with pytest.raises(ProjectionError, match="expects vectors of size 10"):
        make_projector("countsketch", 10, 4, 0).project(np.ones((1, 9)))
    with pytest.raises(ProjectionError, match="must be one of"):
        make_projector("fourier", 10, 4, 0)


def test_streamed_countsketch_equals_the_cached_one():
    """Large inputs (full-model gradients) hash block by block instead of holding a d-sized matrix: same map."""
    from convalue.engine.features.projection import CountSketchProjector

    X = np.random.default_rng(3).normal(size=(3, 4500)).astype(np.float32)
    cached = CountSketchProjector(4500, 64, 5, block=1000)
    streamed = CountSketchProjector(4500, 64, 5, block=1000, cache_limit=0)
    assert cached._S is not None and streamed._S is None
    np.testing.assert_allclose(streamed.project(X), cached.project(X), rtol=1e-5, atol=1e-5)


SCRIPT = """
import numpy as np, sys
from convalue.engine.features.projection import make_projector
x = np.random.default_rng(7).normal(size=(2, 5000)).astype(np.float32)
print(repr(make_projector(sys.argv[1], 5000, 128, 42).project(x).tolist()))
"""


@pytest.mark.parametrize("kind", ["countsketch", "rademacher", "gaussian"])
def test_same_seed_same_vector_in_two_processes(kind):
    outs = [subprocess.run([sys.executable, "-c", SCRIPT, kind], capture_output=True, text=True, check=True).stdout
            for _ in range(2)]
    assert outs[0] == outs[1] and len(outs[0]) > 100
    x = np.random.default_rng(7).normal(size=(2, 5000)).astype(np.float32)
    assert repr(make_projector(kind, 5000, 128, 42).project(x).tolist()) == outs[0].strip()
    assert not np.allclose(make_projector(kind, 5000, 128, 43).project(x), eval(outs[0]))


def test_gram_reducer_matches_dense_product():
    rng = np.random.default_rng(3)
    G = rng.normal(size=(11, 20)).astype(np.float32)
    g = rng.normal(size=20)
    names = [f"g{i}" for i in range(11)]
    red = GramReducer()
    for chunk in ([3, 4, 5], [0], [10, 1, 2], [6, 7, 8, 9]):
        red.add([names[i] for i in chunk], G[chunk])
    K, beta = red.gram(names), red.vectors(names) @ g
    G64 = G.astype(np.float64)
    np.testing.assert_allclose(K, G64 @ G64.T, rtol=1e-12)
    np.testing.assert_allclose(beta, G64 @ g, rtol=1e-12)
    c = cosine(G, g)
    np.testing.assert_allclose(c, beta / np.sqrt(np.diag(K)) / np.linalg.norm(g), rtol=1e-9)
    assert np.all(np.abs(c) <= 1 + 1e-12)
    np.testing.assert_array_equal(red.vectors(["g2", "g0"]), G64[[2, 0]])
    with pytest.raises(ValueError, match="no gradient"):
        red.gram(names + ["absent"])


def test_store_round_trip_resume_and_checksums(tmp_path):
    fp = {"model": "m", "projection": {"kind": "countsketch", "dim": 4, "seed": 0}}
    s = VectorStore(tmp_path / "v", fp)
    X = np.arange(8, dtype=np.float32).reshape(2, 4)
    s.write_block(["a", "b"], ["ka", "kb"], [3, 4], [30, 40], X)
    s.write_block(["c"], ["kc"], [5], [50], X[:1] + 1)
    again = VectorStore(tmp_path / "v", fp)
    assert again.done() == {"a": "ka", "b": "kb", "c": "kc"}
    Y, counts = again.load(["c", "a"])
    np.testing.assert_array_equal(Y, np.stack([X[0] + 1, X[0]]))
    assert counts == {"c": 5, "a": 3}
    # a corrupted block is not counted as done on reopen, and load refuses it
    blk = tmp_path / "v" / again.manifest["blocks"][1]["file"]
    blk.write_bytes(blk.read_bytes()[:-10])
    with pytest.raises(StoreError, match="checksum mismatch"):
        again.load(["c"])
    reopened = VectorStore(tmp_path / "v", fp)
    assert "c" not in reopened.done()
    with pytest.raises(StoreError, match=r"no stored vector for groups \['c'\] \(blocks \['block-000001.parquet'\] were"):
        reopened.load(["c"])


def test_store_reads_only_the_blocks_it_is_asked_for_each_checked_on_the_bytes_read(tmp_path):
    """A load reads the blocks that hold its groups, and nothing else: damage elsewhere does not stop it, damage
    in a block it reads does (checked on the very bytes parsed). Per-example vectors come back per group."""
    fp = {"model": "m", "projection": {"kind": "countsketch", "dim": 4, "seed": 0}}
    s = VectorStore(tmp_path / "v", fp)
    per = [np.full((2, 4), i, dtype=np.float32) for i in range(3)]
    s.write_block(["a", "b"], ["ka", "kb"], [2, 2], [20, 20], np.stack([x.mean(0) for x in per[:2]]), per[:2])
    s.write_block(["c"], ["kc"], [2], [20], per[2][:1], per[2:])
    opened = VectorStore(tmp_path / "v", fp)
    blk = tmp_path / "v" / opened.manifest["blocks"][0]["file"]
    blk.write_bytes(blk.read_bytes()[:-10])  # damaged after the store was opened
    Y, counts = opened.load(["c"])
    np.testing.assert_array_equal(Y, [[2, 2, 2, 2]])
    assert counts == {"c": 2}
    np.testing.assert_array_equal(opened.load_examples(["c"])["c"], per[2])
    with pytest.raises(StoreError, match=r"block-000000.parquet: checksum mismatch"):
        opened.load(["a", "c"])
    with pytest.raises(StoreError, match=r"block-000000.parquet: checksum mismatch"):
        opened.load_examples(["b"])


def _marked(root) -> bool:
    manifest = json.loads((root / "manifest.json").read_text())
    return manifest.get("complete", False) or "groups" in manifest


def test_store_complete_mark_goes_with_any_change(tmp_path):
    fp = {"model": "m", "projection": {"kind": "countsketch", "dim": 4, "seed": 0}}
    root = tmp_path / "v"
    s = VectorStore(root, fp)
    s.write_block(["a"], ["ka"], [1], [1], np.ones((1, 4)))
    s.mark_complete(["a"])
    assert VectorStore(root, fp).done() == {"a": "ka"} and _marked(root)  # a plain reopen keeps the mark
    # a run that writes a new block (say, changed data) and then stops must not leave the store marked complete
    VectorStore(root, fp).write_block(["b"], ["kb"], [1], [1], np.ones((1, 4)))
    assert not _marked(root)
    again = VectorStore(root, fp)
    again.mark_complete(["a", "b"])
    blk = root / again.manifest["blocks"][1]["file"]
    blk.write_bytes(blk.read_bytes()[:-10])
    VectorStore(root, fp)  # the reopen drops the corrupted block, so the store no longer holds every group
    assert not _marked(root)


def test_store_refuses_other_projection(tmp_path):
    fp = {"model": "m", "projection": {"kind": "countsketch", "dim": 4, "seed": 0}}
    VectorStore(tmp_path / "v", fp).write_block(["a"], ["k"], [1], [1], np.ones((1, 4)))
    other = fp | {"projection": {"kind": "countsketch", "dim": 4, "seed": 1}}
    with pytest.raises(StoreError, match=r"differs in \['projection'\]"):
        VectorStore(tmp_path / "v", other)
    fresh = VectorStore(tmp_path / "v", other, overwrite=True)
    assert fresh.done() == {}
    manifest = json.loads((tmp_path / "v" / "manifest.json").read_text())
    assert manifest["fingerprint"]["projection"]["seed"] == 1


@pytest.mark.parametrize("text, message", [
    ("{oops", "not readable JSON"),
    ("[]", "not a vector-store manifest"),
    ('{"fingerprint": {"x": 1}, "blocks": [{"file": "block-000000.parquet"}]}', "not a vector-store manifest"),
])
def test_store_refuses_a_damaged_manifest_unless_overwritten(tmp_path, text, message):
    fp = {"model": "m", "projection": {"kind": "countsketch", "dim": 4, "seed": 0}}
    root = tmp_path / "v"
    VectorStore(root, fp).write_block(["a"], ["k"], [1], [1], np.ones((1, 4)))
    (root / "manifest.json").write_text(text)
    with pytest.raises(StoreError, match=rf"manifest.json: {message}"):
        read_manifest(root)
    with pytest.raises(StoreError, match=rf"manifest.json: {message}.*--overwrite to start it afresh"):
        VectorStore(root, fp)
    fresh = VectorStore(root, fp, overwrite=True)  # starts afresh: the old blocks go with the damaged manifest
    assert fresh.done() == {} and list(root.glob("block-*.parquet")) == []
    assert read_manifest(root)["fingerprint"] == fp


def test_store_rejects_non_finite(tmp_path):
    s = VectorStore(tmp_path / "v", {"x": 1})
    with pytest.raises(StoreError, match="non-finite"):
        s.write_block(["a"], ["k"], [1], [1], np.array([[np.nan, 1.0]]))
