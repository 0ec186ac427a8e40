"""The shipped examples stay usable: every config validates from any directory and writes to runs/ at the repository
root, and the bring-your-own example's data files read through the engine, split and preview as its config asks, and
are exactly what examples/byo/make_data.py builds."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

import convalue

ROOT = Path(__file__).parents[1]
BYO = ROOT / "examples" / "byo"


@pytest.fixture
def at_root(monkeypatch):
    """Run from the repository root, as `make demo` does."""
    monkeypatch.chdir(ROOT)


@pytest.mark.parametrize("path", sorted(str(p.relative_to(ROOT)) for p in ROOT.glob("examples/**/*.yaml")))
def test_every_example_config_validates_and_writes_to_runs_at_the_root(path, at_root):
    cfg = convalue.load_config(path)
    assert cfg.name and cfg.data.candidates
    assert Path(cfg.out) == ROOT / "runs"  # make demo: runs/demo/ at the repository root


def test_byo_config_uses_its_own_files_and_a_model_that_runs_offline(at_root):
    cfg = convalue.load_config("examples/byo/run.yaml")
    assert cfg.model.source == "smollm2-135m-instruct"  # the built-in model; the comment shows a local folder
    assert (cfg.data.target.kind, cfg.data.target.path) == ("jsonl", str(BYO / "computers.jsonl"))
    [pool] = cfg.data.candidates
    assert (pool.kind, pool.path, pool.group_by) == ("parquet", str(BYO / "pool.parquet"), "group")


def test_byo_config_paths_are_relative_to_the_config_file(tmp_path, monkeypatch):
    """A relative path in a config is read against the config file's folder, from whatever directory `convalue`
    runs in; `--out` on the command line stays relative to the current directory."""
    monkeypatch.chdir(tmp_path)
    cfg = convalue.load_config(BYO / "run.yaml")
    assert cfg.data.target.path == str(BYO / "computers.jsonl") and cfg.out == str(ROOT / "runs")
    relative = convalue.load_config(os.path.relpath(BYO / "run.yaml"))  # a relative config path
    assert relative.data.candidates[0].path == str(BYO / "pool.parquet")
    cli_out = convalue.config_from_dict(cfg.to_dict() | {"out": "elsewhere"}, file=str(BYO / "run.yaml"))
    assert cli_out.out == "elsewhere"  # what `convalue run --out elsewhere` builds: the current directory's


def test_byo_data_reads_through_the_engine(at_root):
    from convalue.engine.data.sources import preview_indices, resolve_groups, split_target

    cfg = convalue.load_config("examples/byo/run.yaml")
    target, candidates = resolve_groups(cfg.data)
    assert target.name == "computers" and len(target.examples) == 35
    assert {g.name: len(g.examples) for g in candidates} == {
        "ai": 20, "coding": 20, "food": 17, "science": 20, "sports": 20, "tech_support": 20}
    train, val = split_target(target, cfg.data.val_fraction, cfg.data.seed)
    assert len(val) == 10 and len(train) >= cfg.data.target_preview_size
    for g in candidates:
        assert len(preview_indices(len(g.examples), cfg.data.preview_size, cfg.data.seed, g.name)) == cfg.data.preview_size


def test_byo_data_tokenises_into_full_previews(at_root, smollm2_dir):
    """Every candidate keeps at least m usable examples at the config's max_length (small_groups: error)."""
    from convalue.engine.data.prepare import prepare
    from convalue.engine.model.loading import load_tokenizer

    cfg = convalue.load_config("examples/byo/run.yaml")
    data = prepare(cfg.data, load_tokenizer(smollm2_dir), cfg.model.max_length)
    assert sorted(data.names()) == ["ai", "coding", "food", "science", "sports", "tech_support"]
    assert all(len(it.examples) == cfg.data.preview_size for it in data.items)
    assert len(data.target_item.examples) == cfg.data.target_preview_size


def test_byo_data_files_are_what_make_data_builds(tmp_path):
    """The shipped files are real chatterbot text: make_data.py, run against the installed corpus, rebuilds them."""
    import pyarrow.parquet as pq

    spec = importlib.util.spec_from_file_location("byo_make_data", BYO / "make_data.py")
    make_data = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_data)
    target = [json.loads(line) for line in (BYO / "computers.jsonl").read_text(encoding="utf-8").splitlines()]
    assert target == make_data.pairs("computers")
    pool = pq.read_table(BYO / "pool.parquet").to_pylist()
    assert pool == [{"group": t, **row} for t in make_data.POOL_TOPICS for row in make_data.pairs(t, make_data.PER_GROUP)]
    assert sum(p.stat().st_size for p in BYO.iterdir()) < 200_000


def test_target_train_size_keeps_a_seeded_subset_of_the_train_split(at_root, smollm2_dir):
    """data.target_train_size shrinks the target's train split (what its fine-tunes and g_tar see) to a seeded
    subset, leaves the validation split alone, and refuses a size the split does not have, naming both."""
    from convalue.engine.data.examples import DataError
    from convalue.engine.data.prepare import prepare
    from convalue.engine.model.loading import load_tokenizer

    tok = load_tokenizer(smollm2_dir)
    cfg = convalue.load_config("examples/byo/run.yaml")
    full = prepare(cfg.data, tok, cfg.model.max_length)
    small_cfg = convalue.load_config("examples/byo/run.yaml", overrides=["data.target_train_size=6"])
    small = prepare(small_cfg.data, tok, cfg.model.max_length)
    assert len(small.target_train) == 6 and len(full.target_train) == 25
    assert {e.input_ids for e in small.target_train} <= {e.input_ids for e in full.target_train}
    assert [e.input_ids for e in small.target_val] == [e.input_ids for e in full.target_val]
    assert {e.input_ids for e in small.target_item.examples} <= {e.input_ids for e in small.target_train}
    assert [e.input_ids for e in prepare(small_cfg.data, tok, cfg.model.max_length).target_train] == [e.input_ids for e in small.target_train]
    with pytest.raises(DataError, match=r"target_train_size=40.*only 25 train examples"):
        prepare(convalue.load_config("examples/byo/run.yaml", overrides=["data.target_train_size=40"]).data,
                tok, cfg.model.max_length)
    with pytest.raises(convalue.ConfigError, match="target_train_size"):
        convalue.load_config("examples/byo/run.yaml", overrides=["data.target_train_size=0"])
