"""bench/selection_pays.py: one real regime-map cell per budget on a tiny model, read on two evaluations, and the
table it prints (no timing asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import chatterbot_pairs, tiny_run_config, write_jsonl

pytestmark = pytest.mark.bench  # runs a bench script: `make bench-check`, not `make test`

ROOT = Path(__file__).parents[1]


def test_each_budget_is_a_cell_read_on_every_evaluation(tmp_path, tiny_model_dir, pool_jsonl, target_jsonl):
    heldout = write_jsonl(tmp_path / "heldout.jsonl", chatterbot_pairs("marathi", 20)[12:])
    cfg = tiny_run_config(tmp_path, tiny_model_dir, target_jsonl, pool_jsonl,
                          data={"eval": {"heldout": {"kind": "jsonl", "path": str(heldout)}}})
    config = tmp_path / "cfg.yaml"
    config.write_text(yaml.safe_dump(cfg), encoding="utf-8")
    jsonl = tmp_path / "cells.jsonl"
    bench = [sys.executable, str(ROOT / "bench" / "selection_pays.py"), "--config", str(config), "--jsonl", str(jsonl),
             "--out", str(tmp_path / "runs")]
    proc = subprocess.run([*bench, "--sizes", "4", "--steps", "4", "--budgets", "additive", "fixed", "--repeats",
                           "2", "--k", "1", "--eval-every", "2"], timeout=900, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-4000:]
    cells = [json.loads(line) for line in jsonl.read_text().splitlines()]
    assert [(c["budget"], c["target_train"], c["steps"]) for c in cells] == [("additive", 4, 4), ("fixed", 4, 4)]
    additive, fixed = cells
    assert fixed["kmm_total_steps"] == [4] and all(t > 4 for t in additive["kmm_total_steps"])
    for c in cells:
        assert set(c["evals"]) == {"heldout", "target_val"} and len(c["seeds"]) == 2
        for ev, e in c["evals"].items():
            assert {d["method"] for d in e["kmm_minus"]} == {"target_only", "cosine", "random"}
            alone = next(x for x in e["curves"] if x["method"] == "target_only")  # --eval-every 2: its curve
            assert alone["evaluation"] == ev and alone["steps"] == [2, 4] and alone["seeds"] == 2
    assert "curve: target only" in proc.stdout
    # the target alone is one fine-tune under both budgets: the same losses
    assert additive["evals"]["heldout"]["mean_loss"]["target_only"] == fixed["evals"]["heldout"]["mean_loss"][
        "target_only"]
    text = subprocess.run([*bench, "--table"], check=True, timeout=120, capture_output=True, text=True).stdout
    rows = [r for r in text.splitlines() if r.startswith("| cfg")]
    assert len(rows) == 4 and any("| additive | heldout |" in r for r in rows)
