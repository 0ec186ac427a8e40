"""A flat pool split into groups: real MiniLM embeddings of real chatterbot text, seeded k-means.

The chatterbot corpus is read and the topics embedded once per module (each read parses every language's YAML,
each embedding runs MiniLM): the tests share them where they only read them."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from conftest import chatterbot_pairs, write_jsonl

from convalue.engine.config import SourceConfig
from convalue.engine.data.clustering import embed_texts, kmeans_labels
from convalue.engine.data.examples import DataError, Group
from convalue.engine.data.sources import load_source
from convalue.engine.report.tables import clusters_table

pytestmark = pytest.mark.heavy  # whole runs: scheduled before the light modules (conftest.py)

TOPICS = ["english/computers", "english/food", "english/sports"]


@dataclass(frozen=True)
class Clustered:
    """A source's clusters and what they were made from: the pooled texts and their embeddings, in pool order."""

    groups: dict[str, Group]
    texts: list[str]
    X: np.ndarray


@pytest.fixture(scope="module")
def topic_sources() -> dict[str, Group]:
    """Three real English chatterbot topics (78 pairs), as the source's groups."""
    return load_source(SourceConfig(kind="chatterbot", group_by="language/topic", include=TOPICS))


@pytest.fixture(scope="module")
def topic_clusters() -> Clustered:
    """The three topics pooled and split into 3 clusters, embedded by the built-in encoder in this process (the
    default embedder, its texts and embeddings kept for the tests that compare another encoding with them)."""
    seen: list[tuple[list[str], np.ndarray]] = []

    def kept(texts: list[str], model_dir: Path) -> np.ndarray:
        seen.append((texts, embed_texts(texts, model_dir)))
        return seen[-1][1]

    groups = load_source(SourceConfig(kind="chatterbot", group_by="language/topic", include=TOPICS, clusters=3),
                         embed=kept)
    [(texts, X)] = seen
    return Clustered(groups, texts, X)


@pytest.fixture(scope="module")
def english() -> list[dict]:
    """30 real English chatterbot pairs (a test needing n <= 30 takes the first n, as chatterbot_pairs does)."""
    return chatterbot_pairs("english", 30)


@dataclass(frozen=True)
class FlatPool:
    """A flat JSONL pool (no group column) and its clusters."""

    path: Path
    groups: dict[str, Group]


@pytest.fixture(scope="module")
def flat_pool(english, tmp_path_factory) -> FlatPool:
    """The 30 pairs as a flat JSONL pool split into 4 clusters."""
    pool = write_jsonl(tmp_path_factory.mktemp("flat") / "pool.jsonl", english)
    return FlatPool(pool, load_source(SourceConfig(kind="jsonl", path=str(pool), clusters=4)))


def test_clusters_recover_the_topics_of_a_pooled_source(topic_clusters, topic_sources):
    clusters, sources = topic_clusters.groups, topic_sources
    assert list(clusters) == ["chatterbot/c0", "chatterbot/c1", "chatterbot/c2"]
    # every example is in exactly one cluster, and members point back to it
    seen = [m for g in clusters.values() for m in g.members]
    assert sorted(seen) == sorted((name, i) for name, g in sources.items() for i in range(len(g.examples)))
    for g in clusters.values():
        assert [sources[s].examples[i] for s, i in g.members] == g.examples
    # the embedding sees the topics: each cluster is mostly one topic, each topic mostly one cluster
    majority = [Counter(s for s, _ in g.members).most_common(1)[0] for g in clusters.values()]
    assert sorted(t for t, _ in majority) == TOPICS
    assert sum(n for _, n in majority) >= 0.9 * len(seen)


def test_clusters_are_seeded_and_named_by_first_member(topic_clusters, topic_sources):
    clusters, sources = topic_clusters.groups, topic_sources
    # a second run of the whole default path (read, embed in this process, k-means) makes the same clusters
    again = load_source(SourceConfig(kind="chatterbot", group_by="language/topic", include=TOPICS, clusters=3))
    assert {k: g.members for k, g in again.items()} == {k: g.members for k, g in clusters.items()}
    # the pool is the source's groups in order; c0 holds the pool's first example, c1 the first one not in c0, ...
    offset = dict(zip(sources, np.cumsum([0] + [len(g.examples) for g in sources.values()])))
    firsts = [min(offset[s] + i for s, i in g.members) for g in clusters.values()]
    assert firsts[0] == 0 and firsts == sorted(firsts)


def test_kmeans_labels_are_numbered_by_first_row_without_gaps():
    rng = np.random.default_rng(0)
    centres = rng.standard_normal((4, 8)) * 10
    X = np.concatenate([c + rng.standard_normal((5, 8)) for c in centres[[2, 0, 3, 1]]])
    labels = kmeans_labels(X, 4, seed=0)
    assert labels.tolist() == [0] * 5 + [1] * 5 + [2] * 5 + [3] * 5


def test_flat_jsonl_pool_and_the_clusters_table(flat_pool, english):
    rows, pool, groups = english, flat_pool.path, flat_pool.groups
    assert len(groups) == 4 and all(name.startswith("pool/c") for name in groups)
    table = clusters_table(list(groups.values()), valued={"pool/c0", "pool/c1"})
    assert table.num_rows == 30 and sorted(table["index"].to_pylist()) == list(range(30))
    assert set(table["source_group"].to_pylist()) == {"pool"}
    by_index = {r["index"]: r for r in table.to_pylist()}
    assert [by_index[i]["prompt"] for i in range(30)] == [r["prompt"] for r in rows]
    assert {r["group"] for r in table.to_pylist() if r["valued"]} == {"pool/c0", "pool/c1"}
    assert clusters_table([g for g in load_source(SourceConfig(kind="jsonl", path=str(pool))).values()],
                          set()) is None


def test_more_clusters_than_examples_or_distinct_examples(tmp_path, english):
    rows = english[:5]
    small = write_jsonl(tmp_path / "small.jsonl", rows)
    with pytest.raises(DataError, match=r"'small'.*clusters=6.*only 5 examples"):
        load_source(SourceConfig(kind="jsonl", path=str(small), clusters=6))
    twice = write_jsonl(tmp_path / "twice.jsonl", rows[:2] * 3)
    with pytest.raises(DataError, match=r"clusters=3.*only 2 distinct examples \(of 6\)"):
        load_source(SourceConfig(kind="jsonl", path=str(twice), clusters=3))


def test_an_encoder_folder_that_does_not_load_is_a_clear_error(tmp_path, english):
    import shutil

    from convalue.engine.data.clustering import embedding_dir
    from convalue.engine.model.loading import ModelError

    pool = write_jsonl(tmp_path / "pool.jsonl", english[:6])
    broken = tmp_path / "encoder"
    broken.mkdir()
    (broken / "config.json").write_text('{"model_type": "bert"}')
    with pytest.raises(ModelError, match=r"embedding '.*encoder': no weights in the folder"):
        load_source(SourceConfig(kind="jsonl", path=str(pool), clusters=2, embedding=str(broken)))
    minilm = embedding_dir("minilm")
    copy = tmp_path / "minilm"
    shutil.copytree(minilm, copy)
    weights = (copy / "model.safetensors").read_bytes()
    (copy / "model.safetensors").write_bytes(weights[: len(weights) // 2])  # an interrupted copy
    with pytest.raises(ModelError, match=r"model.safetensors: unreadable weights"):
        load_source(SourceConfig(kind="jsonl", path=str(pool), clusters=2, embedding=str(copy)))
    (copy / "model.safetensors").write_bytes(weights)
    (copy / "tokenizer.json").write_text("{not json")
    (copy / "vocab.txt").unlink()
    with pytest.raises(DataError, match=r"embedding model .*minilm: cannot be loaded"):
        load_source(SourceConfig(kind="jsonl", path=str(pool), clusters=2, embedding=str(copy)))


def test_embedding_on_ray_workers_matches_the_driver(ray_session, topic_sources):
    from convalue.actors.embedder import embed_on_workers
    from convalue.engine.data.clustering import embedding_dir, example_text

    texts = [example_text(e) for e in topic_sources["english/food"].examples]
    assert sorted(texts, key=len) != texts  # chunks go by length: their rows are put back by position
    d = embedding_dir("minilm")
    here = embed_texts(texts, d)
    # one actor (each loads torch and the encoder: seconds of CPU), two of the 4 chunks in flight on it at once;
    # spreading calls over several actors and taking them in completion order is windowed's (tests/test_pool.py)
    there = embed_on_workers(texts, d, workers=1, cpus_per_worker=1, max_in_flight=2, chunk=5)
    assert there.shape == here.shape == (17, 384)
    np.testing.assert_allclose(there, here, atol=1e-5)  # batches differ, so the last bits may


def test_an_encoder_that_fails_on_the_workers_is_reported_as_a_data_error(ray_session, tmp_path):
    import shutil

    from convalue.actors.embedder import embed_on_workers
    from convalue.actors.pool import WorkItemError
    from convalue.engine.data.clustering import embedding_dir

    copy = tmp_path / "minilm"
    shutil.copytree(embedding_dir("minilm"), copy)
    (copy / "tokenizer.json").write_text("{not json")
    (copy / "vocab.txt").unlink()
    with pytest.raises(WorkItemError) as err:
        embed_on_workers(["a", "b"], copy, workers=1, cpus_per_worker=1, max_in_flight=1)
    assert isinstance(err.value.cause, DataError) and "cannot be loaded" in str(err.value.cause)
    assert err.value.what == "embedding of 2 pool texts"  # what the CLI prints before the cause


def test_embedding_cache_reuses_by_content_and_keeps_only_the_run_s_own(tmp_path, caplog):
    from convalue.engine.data.clustering import EmbeddingCache, embedding_dir
    from convalue.engine.store.artifacts import write_npy

    calls = []

    def counted(texts, d):
        calls.append(len(texts))
        return embed_texts(texts, d)

    d = embedding_dir("minilm")
    a, b = ["What is a cat?\nA small feline.", "Hello\nHi"], ["Who wrote Hamlet?\nShakespeare."]
    first = EmbeddingCache(tmp_path / "emb", counted)
    Xa = first(a, d)
    assert calls == [2] and not (tmp_path / "emb").exists()  # nothing written before save()
    first.save(lambda X, path: write_npy(X, path.parent, path.name))
    second = EmbeddingCache(tmp_path / "emb", counted)
    np.testing.assert_array_equal(second(a, d), Xa)
    assert calls == [2] and second.hits == 1
    second(b, d)
    assert calls == [2, 1]
    second.save(lambda X, path: write_npy(X, path.parent, path.name))
    assert len(list((tmp_path / "emb").glob("*.npy"))) == 2
    third = EmbeddingCache(tmp_path / "emb", counted)
    third(list(reversed(a)), d)  # another order is another job
    assert calls == [2, 1, 2]
    third.save(lambda X, path: write_npy(X, path.parent, path.name))  # only this run's embeddings stay
    assert len(list((tmp_path / "emb").glob("*.npy"))) == 1
    # a damaged or mismatched file is embedded again, with a warning
    [kept] = (tmp_path / "emb").glob("*.npy")
    kept.write_bytes(b"not an array")
    with caplog.at_level("WARNING", logger="convalue"):
        EmbeddingCache(tmp_path / "emb", counted)(list(reversed(a)), d)
    assert calls == [2, 1, 2, 2] and "unreadable cached embeddings" in caplog.text
    np.save(kept, np.zeros((5, 384), np.float32))
    with caplog.at_level("WARNING", logger="convalue"):
        EmbeddingCache(tmp_path / "emb", counted)(list(reversed(a)), d)
    assert calls == [2, 1, 2, 2, 2] and "do not fit 2 texts" in caplog.text


def test_cluster_samples_name_size_and_first_prompts(flat_pool):
    from convalue.engine.report.tables import format_cluster_samples

    groups = flat_pool.groups
    table = clusters_table(list(groups.values()), valued=set(groups))
    text = format_cluster_samples(table, ["pool/c1", "pool/c0"], n=2, width=20)
    lines = text.splitlines()
    assert len(lines) == 3 and lines[1].startswith(f"  pool/c1 ({len(groups['pool/c1'].examples)} examples): ")
    first = groups["pool/c0"].examples[0].messages[0][1]
    assert repr(first if len(first) <= 20 else first[:19] + "…") in lines[2]
    assert all(len(part) <= 22 for part in lines[2].split(": ", 1)[1].split(" | "))  # each prompt cut, quoted
    import pyarrow as pa

    dup = pa.table({"group": ["g"] * 3, "prompt": ["same", "same", "other"]})
    assert format_cluster_samples(dup, ["g"]).splitlines()[1] == "  g (3 examples): 'same' | 'other'"


def mean_pooled(model_dir):
    """The pre-sentence-transformers reading of an encoder folder: mean pooling, unit norm."""
    from transformers import AutoModel, AutoTokenizer

    from convalue.engine.data.clustering import MeanPooling

    return MeanPooling(AutoTokenizer.from_pretrained(model_dir), AutoModel.from_pretrained(model_dir).eval())


def test_the_built_in_encoder_runs_through_sentence_transformers_as_mean_pooling_did(topic_clusters,
                                                                                      topic_sources):
    """minilm's folder has modules.json: sentence-transformers encodes it (its pooling, normalisation, length,
    prompts), which for this folder is the mean pooling convalue used before, to float round-off; the clusters of
    the three topics are the same either way (the topics' sentence-transformers embeddings are those the module's
    clusters were made from)."""
    pytest.importorskip("sentence_transformers")
    from convalue.engine.data.clustering import (
        SentenceEncoder,
        embedding_dir,
        encoder_kind,
        example_text,
        load_encoder,
    )

    d = embedding_dir("minilm")
    assert encoder_kind(d) == ("sentence-transformers", None)
    encoder = load_encoder(d)
    assert isinstance(encoder, SentenceEncoder)
    pooled = [example_text(e) for g in topic_sources.values() for e in g.examples]
    assert topic_clusters.texts == pooled
    long = "a long text " * 200  # > 256 tokens
    texts = [*pooled, long]
    mean = mean_pooled(d)
    X, Y = np.concatenate([topic_clusters.X, encoder.encode([long])]), mean.encode(texts)
    assert X.shape == Y.shape == (len(texts), 384) and X.dtype == np.float32
    np.testing.assert_allclose(X, Y, atol=2e-6, rtol=0)

    def mean_embedded(t: list[str], _: Path) -> np.ndarray:
        assert t == pooled
        return Y[:-1]

    again = load_source(SourceConfig(kind="chatterbot", group_by="language/topic", include=TOPICS, clusters=3),
                        embed=mean_embedded)
    assert {k: g.members for k, g in again.items()} == {k: g.members for k, g in topic_clusters.groups.items()}


def test_a_bare_encoder_folder_is_mean_pooled_with_a_warning(tmp_path, caplog, english):
    from convalue.engine.data.clustering import MeanPooling, embedding_dir, load_encoder

    minilm = embedding_dir("minilm")
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "vocab.txt",
                 "special_tokens_map.json"):
        (bare / name).symlink_to(minilm / name)
    assert isinstance(load_encoder(bare), MeanPooling)
    pool = write_jsonl(tmp_path / "pool.jsonl", english[:12])
    with caplog.at_level("WARNING", logger="convalue"):
        groups = load_source(SourceConfig(kind="jsonl", path=str(pool), clusters=2, embedding=str(bare)))
    assert len(groups) == 2
    assert "bare: no modules.json (not a sentence-transformers folder): embedded by mean pooling" in caplog.text
    assert "over at most 256 tokens, normalised to unit length" in caplog.text


def test_without_sentence_transformers_only_a_mean_pooling_folder_is_read(tmp_path, monkeypatch):
    """The fallback reproduces a sentence-transformers folder only where its modules are mean pooling; another
    pooling needs the [embeddings] extra."""
    import importlib.util
    import json
    import shutil

    from convalue.engine.data import clustering

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "sentence_transformers" else real(name, *a))
    minilm = clustering.embedding_dir("minilm")
    kind, note = clustering.encoder_kind(minilm)
    assert kind == "mean pooling" and "sentence-transformers is not installed" in note
    assert isinstance(clustering.load_encoder(minilm), clustering.MeanPooling)
    cls = tmp_path / "cls"
    shutil.copytree(minilm / "1_Pooling", cls / "1_Pooling")
    shutil.copy(minilm / "modules.json", cls)
    config = json.loads((cls / "1_Pooling" / "config.json").read_text())
    (cls / "1_Pooling" / "config.json").write_text(json.dumps(
        config | {"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False}))
    with pytest.raises(DataError, match=r"need the sentence-transformers package: pip install 'convalue\[embeddings\]'"):
        clustering.encoder_kind(cls)
