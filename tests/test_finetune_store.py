"""Stored fine-tunes: keyed by everything that decides the result; damaged records are trained again."""

from __future__ import annotations

import json
import logging
from dataclasses import replace

import pytest

from convalue.engine.config import (
    FeaturesConfig,
    FinetuneConfig,
    LoraConfig,
    ModelConfig,
    ProjectionConfig,
)
from convalue.engine.data.prepare import examples_digest
from convalue.engine.data.tokenize import IGNORE, TokenizedExample
from convalue.engine.model.spec import ReplicaSpec
from convalue.engine.store.finetunes import FinetuneStore, job_settings


def _ex(*ids: int) -> TokenizedExample:
    return TokenizedExample(tuple(ids), (IGNORE,) + tuple(ids[1:]))


SPEC = ReplicaSpec(model_dir="/cache/smollm2-x", model=ModelConfig(), lora=LoraConfig(r=8, alpha=16),
                   features=FeaturesConfig(), projection=ProjectionConfig(),
                   finetune=FinetuneConfig(steps=24, rho=0.5, batch_size=4, lr=2e-4), pad_id=2)


def _with(spec: ReplicaSpec = SPEC, **finetune) -> ReplicaSpec:
    """spec with some finetune settings changed."""
    return replace(spec, finetune=replace(spec.finetune, **finetune))
TRAIN, VAL = [_ex(1, 2, 3), _ex(4, 5)], [_ex(6, 7, 8)]
AUX = {"hindi": [_ex(9, 10)], "urdu": [_ex(11, 12, 13)]}
RESULT = {"label": "target + KMM top-2", "groups": ["hindi", "urdu"], "steps": 24, "target_steps": 12,
          "aux_steps": 12, "val_loss": 2.91, "base_val_loss": None, "first_train_loss": 3.1,
          "last_train_loss": 2.8, "seconds": 64.5}


def _store(tmp_path, spec=SPEC, train=TRAIN, val=VAL) -> FinetuneStore:
    return FinetuneStore(tmp_path / "finetunes", job_settings(spec), train, val)


def test_a_stored_fine_tune_is_read_back(tmp_path):
    store = _store(tmp_path)
    key = store.job_key(AUX)
    assert store.get(key) is None and store.get_base() is None
    store.put(key, RESULT)
    store.put_base(3.1556)
    again = _store(tmp_path)  # another run of the same folder
    assert again.get(again.job_key(AUX)) == RESULT and again.get_base() == 3.1556
    assert sorted(p.name for p in (tmp_path / "finetunes").iterdir()) == sorted(
        [f"{key}.json", f"{store.base_key()}.json"])  # no temporary left


@pytest.mark.parametrize("change", [
    lambda s: _with(s, steps=25),
    lambda s: _with(s, rho=0.4),
    lambda s: _with(s, seed=1),
    lambda s: replace(s, lora=LoraConfig(r=4, alpha=16)),
    lambda s: replace(s, model=ModelConfig(dtype="bfloat16")),
    lambda s: replace(s, device="cuda"),
    lambda s: replace(s, threads=2),
    lambda s: replace(s, model_digest="0" * 64),
])
def test_every_setting_that_decides_the_result_is_in_the_key(tmp_path, change):
    assert _store(tmp_path, change(SPEC)).job_key(AUX) != _store(tmp_path).job_key(AUX)


def test_the_model_is_keyed_by_its_content_not_its_folder(tmp_path):
    moved = replace(SPEC, model_dir="/elsewhere/same-weights")
    assert _store(tmp_path, moved).job_key(AUX) == _store(tmp_path).job_key(AUX)
    assert _store(tmp_path, moved).base_key() == _store(tmp_path).base_key()
    changed = replace(SPEC, model_digest="1" * 64)
    assert _store(tmp_path, changed).base_key() != _store(tmp_path).base_key()


def test_which_runs_happen_is_not_in_the_key(tmp_path):
    wider = _with(ks=[1, 2, 3], baselines=["random"], repeats=5)
    assert _store(tmp_path, wider).job_key(AUX) == _store(tmp_path).job_key(AUX)


def test_a_repeat_seed_keys_as_a_run_with_that_seed(tmp_path):
    """Seed 1 of a run with repeats is the fine-tune of a run whose finetune.seed is 1: one record serves both."""
    seed = SPEC.finetune.seed
    seeded = _with(seed=seed + 1)
    store = _store(tmp_path)
    assert store.job_key(AUX, seed) == store.job_key(AUX)
    assert store.job_key(AUX, seed + 1) == _store(tmp_path, seeded).job_key(AUX) != store.job_key(AUX)


def test_mixture_weights_are_in_the_key(tmp_path):
    store = _store(tmp_path)
    weighted = store.job_key(AUX, weights={"hindi": 0.7, "urdu": 0.3})
    assert weighted != store.job_key(AUX) and weighted != store.job_key(AUX, weights={"hindi": 0.3, "urdu": 0.7})
    assert store.job_key(AUX, weights=None) == store.job_key(AUX)


def test_rho_k_is_in_the_key_as_the_run_of_that_rho(tmp_path):
    """A budget's rho_k keys like a run whose finetune.rho is rho_k; the mapping itself (and the given mixture
    weights, which reach the key as each job's weights) is not in the key."""
    store = _store(tmp_path)
    rho = SPEC.finetune.rho
    assert store.job_key(AUX, rho=rho) == store.job_key(AUX)
    other = _with(rho=0.25)
    assert store.job_key(AUX, rho=0.25) == _store(tmp_path, other).job_key(AUX) != store.job_key(AUX)
    assert store.job_key(AUX, 3, rho=0.25) != store.job_key(AUX, rho=0.25)
    mapped = _with(rho_by_k={1: 0.25}, mixture="given", mixture_weights={"hindi": 2.0, "urdu": 1.0})
    assert _store(tmp_path, mapped).job_key(AUX) == store.job_key(AUX)


def test_data_is_in_the_key(tmp_path):
    base = _store(tmp_path).job_key(AUX)
    assert _store(tmp_path, train=TRAIN[:1]).job_key(AUX) != base
    assert _store(tmp_path, val=[_ex(6, 7, 9)]).job_key(AUX) != base
    assert _store(tmp_path).job_key({"hindi": AUX["hindi"]}) != base
    assert _store(tmp_path).job_key({"hindi": AUX["urdu"], "urdu": AUX["hindi"]}) != base  # names order the draws
    assert examples_digest([_ex(1, 2), _ex(3)]) != examples_digest([_ex(1), _ex(2, 3)])  # boundaries count


def test_a_damaged_record_is_trained_again(tmp_path, caplog):
    store = _store(tmp_path)
    key = store.job_key(AUX)
    store.put(key, RESULT)
    path = tmp_path / "finetunes" / f"{key}.json"
    for damage in ("{not json", json.dumps(RESULT | {"key": key, "val_loss": float("nan")}),
                   json.dumps(RESULT | {"key": "another"}), json.dumps({k: v for k, v in RESULT.items()
                                                                      if k != "groups"} | {"key": key})):
        path.write_text(damage)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="convalue"):
            assert store.get(key) is None
        assert "trained again" in caplog.text
