"""Models the Hugging Face way: model.source as a hub id and model.revision, resolved through a real hub cache on
disk with HF_HUB_OFFLINE=1 (the tiny Llama's files as snapshots, refs naming commits)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from hub_cache import hub_repo

from convalue.engine.config import ModelConfig
from convalue.engine.model.loading import (
    ModelError,
    load_model,
    load_tokenizer,
    resolve_model,
    resolve_model_dir,
)

MAIN, V2, BROKEN = "a1" * 20, "b2" * 20, "c3" * 20
ROOT = Path(__file__).parents[1]


@pytest.fixture(scope="module")
def cache(tmp_path_factory, tiny_model_dir) -> Path:
    """org/tiny: `main` the tiny Llama, tag `v2` a copy whose config carries a marker, `broken` a config only."""
    root = tmp_path_factory.mktemp("hub")
    v2 = root.parent / f"{root.name}-v2"
    shutil.copytree(tiny_model_dir, v2)
    config = json.loads((v2 / "config.json").read_text())
    (v2 / "config.json").write_text(json.dumps(config | {"convalue_marker": "v2"}))
    broken = root.parent / f"{root.name}-broken"
    broken.mkdir()
    shutil.copy(tiny_model_dir / "config.json", broken)
    hub_repo(root, "org/tiny", {MAIN: tiny_model_dir, V2: v2, BROKEN: broken}, {"main": MAIN, "v2": V2,
                                                                                 "broken": BROKEN})
    return root


@pytest.fixture
def offline(monkeypatch, cache) -> Path:
    """huggingface_hub offline, reading the test cache (both are read once, when the library is imported: the
    subprocess test below sets them the way a user does)."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return cache


def test_a_hub_id_resolves_to_its_cached_snapshot_and_loads(offline, tiny_model_dir, tmp_path):
    import torch

    from convalue.engine.model.digest import model_digest

    resolved = resolve_model(ModelConfig(source="org/tiny"))
    assert resolved.commit == MAIN
    assert resolved.dir == offline / "models--org--tiny" / "snapshots" / MAIN
    assert resolve_model_dir(ModelConfig(source="org/tiny")) == resolved.dir
    tok = load_tokenizer(resolved.dir)
    model = load_model(resolved.dir)
    ids = tok.apply_chat_template([{"role": "user", "content": "hi"}], return_tensors="pt", return_dict=True)
    with torch.no_grad():
        assert model(**ids).logits.shape[-1] == len(tok)
    # the snapshot's files are symlinks into blobs: the content hash is the local folder's
    assert model_digest(resolved.dir, tmp_path) == model_digest(tiny_model_dir, tmp_path)


@pytest.mark.parametrize(("revision", "commit"), [("main", MAIN), ("v2", V2), (MAIN, MAIN), (V2, V2)])
def test_the_revision_picks_the_snapshot(offline, revision, commit):
    from transformers import AutoConfig

    resolved = resolve_model(ModelConfig(source="org/tiny", revision=revision))
    assert (resolved.commit, resolved.dir.name) == (commit, commit)
    marker = getattr(AutoConfig.from_pretrained(resolved.dir), "convalue_marker", None)
    assert marker == ("v2" if commit == V2 else None)


@pytest.mark.parametrize(("source", "revision"), [("org/absent", "main"), ("org/tiny", "v3"), ("org/tiny", "d4" * 20)])
def test_a_model_not_in_the_cache_says_how_to_fetch_it(offline, source, revision):
    with pytest.raises(ModelError) as err:
        resolve_model(ModelConfig(source=source, revision=revision))
    msg = str(err.value)
    assert f"model.source {source!r} (revision {revision!r})" in msg and str(offline) in msg
    assert f"`hf download {source} --revision {revision}`" in msg and "unset HF_HUB_OFFLINE" in msg


def test_a_snapshot_without_weights_is_refused(offline):
    with pytest.raises(ModelError, match=rf"org/tiny@broken: snapshot .*{BROKEN}.*: no weights in the folder"):
        resolve_model(ModelConfig(source="org/tiny", revision="broken"))


SCRIPT = textwrap.dedent("""
    import json, sys
    from convalue.engine.config import ModelConfig
    from convalue.engine.model.loading import ModelError, load_tokenizer, resolve_model
    out = {}
    for rev in ("main", "v2"):
        r = resolve_model(ModelConfig(source="org/tiny", revision=rev))
        out[rev] = [str(r.dir), r.commit, len(load_tokenizer(r.dir))]
    try:
        resolve_model(ModelConfig(source="org/absent"))
    except ModelError as exc:
        out["absent"] = str(exc)
    print(json.dumps(out))
""")


def _env(**over: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    return env | {"HF_HUB_DISABLE_TELEMETRY": "1"} | over


def test_hf_hub_cache_hf_home_and_offline_are_read_from_the_environment(cache, tmp_path):
    """What a user sets: HF_HUB_CACHE (or HF_HOME, whose hub/ is the cache) and HF_HUB_OFFLINE=1."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "hub").symlink_to(cache)
    for env in (_env(HF_HUB_CACHE=str(cache), HF_HUB_OFFLINE="1"), _env(HF_HOME=str(home), HF_HUB_OFFLINE="1")):
        proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300,
                              check=False)
        assert proc.returncode == 0, proc.stderr[-2000:]
        out = json.loads(proc.stdout.strip().splitlines()[-1])
        assert [out["main"][1], out["v2"][1]] == [MAIN, V2] and out["main"][2] > 40000
        assert Path(out["main"][0]).name == MAIN
        assert "hf download org/absent --revision main" in out["absent"] and "HF_HUB_OFFLINE" in out["absent"]


def test_the_cli_exits_2_with_the_fetch_hint_and_does_not_force_offline(cache, tmp_path):
    """`convalue run` with a hub id absent from the cache: exit code 2 and how to fetch it, before Ray starts; the
    CLI leaves HF_HUB_OFFLINE as the user set it (the driver no longer sets it)."""
    cfg = {"name": "hub", "out": "runs", "model": {"source": "org/absent", "revision": "v1"},
           "data": {"target": {"kind": "chatterbot", "include": ["marathi"]},
                    "candidates": [{"kind": "chatterbot", "include": ["hindi", "english"]}]}}
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(cfg))
    proc = subprocess.run([sys.executable, "-m", "convalue", "run", str(tmp_path / "run.yaml")], cwd=tmp_path,
                          env=_env(HF_HUB_CACHE=str(cache), HF_HUB_OFFLINE="1"), capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "convalue: error: model.source 'org/absent' (revision 'v1')" in proc.stderr
    assert "hf download org/absent --revision v1" in proc.stderr
    assert "HF_HUB_OFFLINE" not in (ROOT / "engine" / "driver" / "cli.py").read_text()
