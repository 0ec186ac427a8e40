"""Integration: the real SmolLM2-135M-Instruct on real chatterbot groups, through Ray, with a fine-tune."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from convalue.engine.config import config_from_dict

pytestmark = [pytest.mark.slow, pytest.mark.heavy]  # heavy: scheduled before the light modules (conftest.py)


def test_real_model_values_real_languages(ray_session, smollm2_dir, tmp_path):
    from convalue.engine.driver.pipeline import run

    cfg = {
        "name": "smol",
        "out": str(tmp_path),
        "model": {"source": "smollm2-135m-instruct", "max_length": 48, "batch_size": 4},
        "data": {"target": {"kind": "chatterbot", "group_by": "language", "include": ["marathi"]},
                 "candidates": [{"kind": "chatterbot", "group_by": "language",
                                 "include": ["hindi", "english", "spanish"]}],
                 "preview_size": 2, "target_preview_size": 4, "seed": 0},
        "projection": {"kind": "countsketch", "dim": 2048, "seed": 0},
        "solver": {"gamma": 0.05, "normalize": "cosine"},
        "select": {"k": 1},
        "finetune": {"enabled": True, "steps": 2, "batch_size": 2, "eval_batch_size": 8},
        "ray": {"workers": 1, "cpus_per_worker": 1, "groups_per_call": 1},
    }
    summary = run(config_from_dict(cfg))
    assert summary.status == "complete"
    assert summary.featurize["dim_in"] == 184_320  # 30 layers x (576 + 192) x r=8 lora_B entries
    table = pq.read_table(tmp_path / "smol" / "scores.parquet").to_pylist()
    assert sorted(r["group"] for r in table) == ["english", "hindi", "spanish"]
    assert all(-1 <= r["cosine"] <= 1 for r in table)
    assert any(r["cosine"] > 0.05 for r in table)  # real gradients of related chat data align with the target
    ft = summary.finetune
    assert ft[0]["base_val_loss"] > 0.5 and all(r["val_loss"] > 0 for r in ft)
