"""Data the Hugging Face way: source kind `hf` through `datasets`, from folders written by save_to_disk and from a
real hub cache on disk (parquet files, a README with two configurations, refs) read with HF_HUB_OFFLINE=1."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from conftest import chatterbot_pairs
from hub_cache import hub_repo

from convalue.engine.config import SourceConfig, load_config
from convalue.engine.data.examples import DataError
from convalue.engine.data.sources import load_source, resolve_groups

datasets = pytest.importorskip("datasets")
MAIN, V2 = "e5" * 20, "f6" * 20
README = """---
configs:
- config_name: default
  data_files:
  - split: train
    path: data/train-*
  - split: test
    path: data/test-*
- config_name: hindi
  data_files:
  - split: train
    path: hindi/train-*
---
# Chat pairs from chatterbot-corpus
"""


@pytest.fixture(autouse=True)
def datasets_cache(monkeypatch, tmp_path):
    """datasets' own cache (prepared Arrow files, locks) in the test's folder, not the user's home."""
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "datasets-cache")


@pytest.fixture(scope="module")
def pairs() -> dict[str, list[dict]]:
    return {lang: chatterbot_pairs(lang, 8) for lang in ("english", "spanish", "hindi", "marathi")}


def repo_files(folder: Path, pairs: dict, train: list[str]) -> Path:
    """A dataset repository as the hub serves it: README configs and parquet shards."""
    (folder / "data").mkdir(parents=True)
    (folder / "hindi").mkdir()
    (folder / "README.md").write_text(README)
    rows = [r | {"lang": lang} for lang in train for r in pairs[lang]]
    pq.write_table(pa.Table.from_pylist(rows[: len(rows) // 2]), folder / "data" / "train-00000-of-00002.parquet")
    pq.write_table(pa.Table.from_pylist(rows[len(rows) // 2:]), folder / "data" / "train-00001-of-00002.parquet")
    pq.write_table(pa.Table.from_pylist(pairs["marathi"]), folder / "data" / "test-00000-of-00001.parquet")
    pq.write_table(pa.Table.from_pylist(pairs["hindi"]), folder / "hindi" / "train-00000-of-00001.parquet")
    return folder


@pytest.fixture(scope="module")
def cache(tmp_path_factory, pairs) -> Path:
    """org/chat in a hub cache: `main` trains on english+spanish, tag `v2` on english alone."""
    root = tmp_path_factory.mktemp("hub")
    main = repo_files(root.parent / f"{root.name}-main", pairs, ["english", "spanish"])
    v2 = repo_files(root.parent / f"{root.name}-v2", pairs, ["english"])
    hub_repo(root, "org/chat", {MAIN: main, V2: v2}, {"main": MAIN, "v2": V2}, repo_type="dataset")
    return root


@pytest.fixture
def offline(monkeypatch, cache) -> Path:
    """huggingface_hub and datasets offline, reading the test cache (read at import: see the subprocess test)."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    return cache


def texts(groups: dict) -> dict[str, list[str]]:
    return {name: [e.messages[0][1] for e in g.examples] for name, g in groups.items()}


def test_a_save_to_disk_folder_reads_like_a_file(tmp_path, pairs):
    rows = [r | {"lang": lang} for lang in ("english", "spanish") for r in pairs[lang]]
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "pool"))
    groups = load_source(SourceConfig(kind="hf", path=str(tmp_path / "pool"), group_by="lang"))
    assert texts(groups) == {lang: [r["prompt"] for r in pairs[lang]] for lang in ("english", "spanish")}
    whole = load_source(SourceConfig(kind="hf", path=str(tmp_path / "pool")))
    assert list(whole) == ["pool"] and len(whole["pool"].examples) == 16
    with pytest.raises(DataError, match=r"pool: holds a single Dataset, which has no splits; leave `split` null"):
        load_source(SourceConfig(kind="hf", path=str(tmp_path / "pool"), split="train"))


def test_a_saved_dataset_dict_picks_its_split(tmp_path, pairs):
    dd = datasets.DatasetDict({"train": datasets.Dataset.from_list(pairs["english"]),
                               "test": datasets.Dataset.from_list(pairs["marathi"])})
    dd.save_to_disk(str(tmp_path / "dd"))
    assert texts(load_source(SourceConfig(kind="hf", path=str(tmp_path / "dd")))) == {
        "dd": [r["prompt"] for r in pairs["english"]]}
    test = load_source(SourceConfig(kind="hf", path=str(tmp_path / "dd"), split="test"))
    assert texts(test)["dd"] == [r["prompt"] for r in pairs["marathi"]]
    with pytest.raises(DataError, match=r"dd: no split 'validation' \(it has \['test', 'train'\]\)"):
        load_source(SourceConfig(kind="hf", path=str(tmp_path / "dd"), split="validation"))


def test_a_bad_row_names_the_dataset_row_and_field(tmp_path, pairs):
    rows = [*pairs["english"][:3], {"prompt": "only a prompt", "response": None}]
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "bad"))
    with pytest.raises(DataError, match=r"bad row 3: missing field\(s\) \['response'\]"):
        load_source(SourceConfig(kind="hf", path=str(tmp_path / "bad")))
    chat = [{"messages": [{"role": "user", "content": "hi"}, {"role": "robot", "content": "yo"}]}]
    datasets.Dataset.from_list(chat).save_to_disk(str(tmp_path / "chat"))
    with pytest.raises(DataError, match=r"chat row 0: messages\[1\].role must be one of"):
        load_source(SourceConfig(kind="hf", path=str(tmp_path / "chat")))


@pytest.mark.parametrize(("revision", "name", "split", "langs"), [
    (None, None, None, ["english", "spanish"]), ("v2", None, None, ["english"]), (MAIN, None, None,
                                                                                  ["english", "spanish"]),
    (None, "hindi", None, ["hindi"]), (None, None, "test", ["marathi"]), (None, None, "train[:3]", ["english"])])
def test_a_hub_id_reads_from_the_hub_cache_offline(offline, pairs, revision, name, split, langs):
    src = SourceConfig(kind="hf", path="org/chat", revision=revision, name=name, split=split)
    groups = load_source(src)
    want = [r["prompt"] for lang in langs for r in pairs[lang]][: 3 if split == "train[:3]" else None]
    assert texts(groups) == {"chat": want}


def test_a_dataset_not_in_the_cache_says_how_to_fetch_it(offline):
    with pytest.raises(DataError) as err:
        load_source(SourceConfig(kind="hf", path="org/absent", split="train"))
    msg = str(err.value)
    assert "source 'org/absent' (revision 'main', split 'train'): not in the local Hugging Face cache" in msg
    assert "`hf download org/absent --revision main --repo-type dataset`" in msg
    with pytest.raises(DataError, match=r"revision 'v9'.*hf download org/chat --revision v9 --repo-type dataset"):
        load_source(SourceConfig(kind="hf", path="org/chat", revision="v9"))


def test_a_dataset_repository_folder_in_a_config(tmp_path, pairs):
    """A relative folder (a local copy of a dataset repository) beside the config, as target and candidates."""
    repo_files(tmp_path / "chat", pairs, ["english", "spanish"])
    cfg = {"name": "x", "data": {"target": {"kind": "hf", "path": "chat", "split": "test"},
                                 "candidates": [{"kind": "hf", "path": "./chat", "group_by": "lang"}]}}
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(cfg))
    data = load_config(tmp_path / "run.yaml").data
    assert data.target.path == data.candidates[0].path == str(tmp_path / "chat")
    target, candidates = resolve_groups(data)
    assert (target.name, len(target.examples)) == ("chat", 8)
    assert [g.name for g in candidates] == ["english", "spanish"]


def test_without_datasets_the_error_names_the_extra(tmp_path, monkeypatch, pairs):
    datasets.Dataset.from_list(pairs["english"]).save_to_disk(str(tmp_path / "pool"))
    monkeypatch.setitem(sys.modules, "datasets", None)  # `import datasets` now fails as if not installed
    with pytest.raises(DataError, match=r"source kind `hf` needs the `datasets` package: pip install 'convalue\[hf\]'"):
        load_source(SourceConfig(kind="hf", path=str(tmp_path / "pool")))


SCRIPT = textwrap.dedent("""
    import json
    from convalue.engine.config import SourceConfig
    from convalue.engine.data.sources import load_source
    g = load_source(SourceConfig(kind="hf", path="org/chat", revision="v2", group_by="lang"))
    print(json.dumps({k: len(v.examples) for k, v in g.items()}))
""")


def test_the_environment_s_cache_and_offline_setting_are_honoured(cache, tmp_path):
    """What a user sets: HF_HUB_CACHE and HF_HUB_OFFLINE=1 (read when the libraries are imported)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")} | {
        "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1", "HF_DATASETS_CACHE": str(tmp_path / "datasets")}
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"english": 8}
