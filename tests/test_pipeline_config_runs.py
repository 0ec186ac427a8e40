"""Runs that need only the pipeline tests' config, not their first run's outputs: other representations (GRPO,
full parameters with a Fisher metric, per-example vectors with the bootstrap), a worker's input error through the
CLI, and a flat pool. A module of their own so that pytest-xdist can run them beside tests/test_pipeline.py and
tests/test_pipeline_evaluations.py (`--dist loadfile` gives each file to one worker)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from convalue.engine.config import config_from_dict
from convalue.engine.driver.pipeline import run
from convalue.engine.driver.resolve import resolve

pytestmark = pytest.mark.heavy  # whole runs: scheduled before the light modules (conftest.py)


def test_grpo_representation_from_config(pipeline_config):
    """GRPO on real prompts: sampled completions, a reward from a user file, group vectors, a certified solve."""
    tmp, data = pipeline_config
    reward = Path(__file__).parent / "rewards_for_tests.py"
    cfg = data | {"name": "grpo", "finetune": {"enabled": False},
                  "features": {"representation": "grpo", "grpo_generations": 3, "grpo_max_new_tokens": 6,
                               "grpo_reward": f"{reward}:length"}}
    summary = run(config_from_dict(cfg))
    assert summary.status == "complete" and summary.solver.kkt < 1e-6
    stats = summary.featurize["grpo"]
    assert stats["prompts"] == 6 * 4 and stats["zero_advantage_prompts"] == 0 and stats["mean_reward"] > 0
    manifest = json.loads((tmp / "runs" / "grpo" / "vectors" / "manifest.json").read_text())
    assert manifest["fingerprint"]["features"]["grpo_reward"].endswith(":length")
    constant = cfg | {"name": "grpo0", "features": cfg["features"] | {"grpo_reward": f"{reward}:constant"}}
    with pytest.raises(ValueError, match="exactly zero for .*the target.*same reward"):
        run(config_from_dict(constant))
    on_disk = json.loads((tmp / "runs" / "grpo0" / "summary.json").read_text())
    assert on_disk["status"] == "failed" and on_disk["failed_stage"] == "gram"
    assert not (tmp / "runs" / "grpo0" / "scores.parquet").exists()


def test_cli_reports_a_worker_s_input_error_without_the_remote_traceback(pipeline_config, tmp_path, capsys):
    """A reward function that raises in a gradient worker: exit 2 and one line naming the groups and the reward."""
    import yaml

    from convalue.engine.driver.cli import main

    tmp, data = pipeline_config
    reward = Path(__file__).parent / "rewards_for_tests.py"
    cfg = data | {"name": "grpo_broken", "finetune": {"enabled": False},
                  "features": {"representation": "grpo", "grpo_generations": 2, "grpo_max_new_tokens": 4,
                               "grpo_reward": f"{reward}:broken"}}
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert main(["run", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("convalue: error: [") and "reward function 'broken' raised ValueError: boom" in err
    assert "Traceback" not in err and "ray::" not in err
    on_disk = json.loads((tmp / "runs" / "grpo_broken" / "summary.json").read_text())
    assert on_disk["status"] == "failed" and on_disk["failed_stage"] == "featurize"


def test_full_parameters_with_the_diagonal_fisher_metric(pipeline_config):
    tmp, data = pipeline_config
    cfg = data | {"name": "full", "finetune": {"enabled": False},
                  "features": {"parameters": "full", "metric": "diag_fisher"}}
    summary = run(config_from_dict(cfg))
    assert summary.status == "complete" and summary.solver.kkt < 1e-6
    assert summary.featurize["dim_in"] > 3_000_000  # every weight of the tiny Llama
    assert summary.metric["kind"] == "diag_fisher" and summary.metric["support"] > 0
    manifest = json.loads((tmp / "runs" / "full" / "vectors" / "manifest.json").read_text())
    assert manifest["fingerprint"]["parameters"] == "full"
    table = pq.read_table(tmp / "runs" / "full" / "scores.parquet")
    assert np.all(np.abs(table.column("cosine").to_numpy()) <= 1 + 1e-9)


def test_per_example_vectors_are_kept_and_average_to_the_group_vector(pipeline_config):
    from convalue.engine.store.vectors import VectorStore

    tmp, data = pipeline_config
    cfg = data | {"name": "pe", "finetune": {"enabled": False}, "model": data["model"] | {"token_budget": 512},
                  "features": {"keep_per_example": True}, "bootstrap": {"samples": 12, "seed": 1},
                  "ray": data["ray"] | {"workers": 2}}
    summary = run(config_from_dict(cfg))
    assert summary.status == "complete"
    # the bootstrap over the previews: one row per group in rank order, the run's scores beside the spread
    boot = pq.read_table(tmp / "runs" / "pe" / "bootstrap.parquet").to_pylist()
    scores = pq.read_table(tmp / "runs" / "pe" / "scores.parquet").to_pylist()
    assert [r["group"] for r in boot] == [r["group"] for r in scores]
    assert [r["score"] for r in boot] == [r["score"] for r in scores]
    assert all(0 <= r["p_selected"] <= 1 and r["score_q025"] <= r["score_q975"] for r in boot)
    stats = summary.bootstrap
    assert stats["samples"] == 12 and stats["seed"] == 1 and 0 <= stats["same_selection"] <= 1
    assert summary.progress["bootstrap"]["done"] == summary.progress["bootstrap"]["total"] == 12
    assert set(stats["p_selected"]) == set(summary.selected)
    assert sum(r["p_selected"] for r in boot) <= data["select"]["k"] + 1e-9  # at most k per resample
    # the run spread its 12 resamples over 2 solver actors in 8 parts; a re-solve at the run's own settings redoes
    # them one after another in this process: the same resamples, so the same table
    resolve(tmp / "runs" / "pe", gamma=data["solver"]["gamma"], budget=None, method=None, normalize=None)
    redone = pq.read_table(tmp / "runs" / "pe" / "bootstrap.parquet").to_pylist()
    assert [(r["group"], r["p_selected"], r["p_positive"]) for r in redone] == [
        (r["group"], r["p_selected"], r["p_positive"]) for r in boot]
    for col in ("score", "score_mean", "score_std", "score_q025", "score_q975"):
        assert [r[col] for r in redone] == pytest.approx([r[col] for r in boot], rel=1e-9, abs=1e-12)
    # a re-solve redoes the bootstrap for its own settings: the table describes the new scores, not the old
    out = resolve(tmp / "runs" / "pe", gamma=data["solver"]["gamma"] / 4, budget=None, method=None, normalize=None)
    again = pq.read_table(tmp / "runs" / "pe" / "bootstrap.parquet").to_pylist()
    rescored = pq.read_table(tmp / "runs" / "pe" / "scores.parquet").to_pylist()
    assert [(r["group"], r["score"]) for r in again] == [(r["group"], r["score"]) for r in rescored]
    assert [r["score"] for r in again] != [r["score"] for r in boot]
    assert out.bootstrap["samples"] == 12 and set(out.bootstrap["p_selected"]) == set(out.selected)
    root = tmp / "runs" / "pe" / "vectors"
    store = VectorStore(root, json.loads((root / "manifest.json").read_text())["fingerprint"])
    names = summary.order
    X, counts = store.load(names)
    per_example = store.load_examples(names)
    for name, x in zip(names, X):
        assert per_example[name].shape == (counts[name], X.shape[1])
        np.testing.assert_allclose(per_example[name].mean(axis=0), x, rtol=1e-4, atol=1e-6)  # projection is linear
    with pytest.raises(ValueError, match="keep_per_example"):
        config_from_dict(cfg | {"features": {"keep_per_example": True, "representation": "task_vector"}})


def test_a_flat_pool_is_clustered_valued_and_mapped_back(pipeline_config, capsys):
    import yaml
    from conftest import chatterbot_pairs, write_jsonl

    from convalue.engine.driver.cli import main

    tmp, data = pipeline_config
    rows = [r for lang in ("english", "spanish", "german", "hindi") for r in chatterbot_pairs(lang, 6)]
    pool = write_jsonl(tmp / "flat.jsonl", rows)  # no group column: one flat pool
    cfg = data | {"name": "flat", "finetune": {"enabled": False},
                  "data": data["data"] | {"candidates": [{"kind": "jsonl", "path": str(pool), "clusters": 4}],
                                          "small_groups": "keep"}}
    summary = run(config_from_dict(cfg))
    run_dir = tmp / "runs" / "flat"
    stats = summary.data["clusters"]
    assert summary.status == "complete" and (stats["groups"], stats["examples"]) == (4, 24)
    scores = pq.read_table(run_dir / "scores.parquet")
    clusters = pq.read_table(run_dir / "clusters.parquet").to_pylist()
    assert sorted(scores["group"].to_pylist()) == ["flat/c0", "flat/c1", "flat/c2", "flat/c3"]
    assert sorted(r["index"] for r in clusters) == list(range(24))
    assert all(r["prompt"] == rows[r["index"]]["prompt"] and r["valued"] for r in clusters)
    sizes = Counter(r["group"] for r in clusters)
    assert dict(zip(scores["group"].to_pylist(), scores["n_examples"].to_pylist())) == sizes
    assert (stats["smallest"], stats["largest"]) == (min(sizes.values()), max(sizes.values()))
    assert stats["pools_reusing_embeddings"] == 0 and len(list((run_dir / "embeddings").glob("*.npy"))) == 1
    # another k on the same pool, through the CLI: the embeddings come from the run folder, the clusters are new,
    # and the selected clusters' first prompts are printed from clusters.parquet
    cfg["data"]["candidates"][0]["clusters"] = 3
    path = tmp / "flat.yaml"
    path.write_text(yaml.safe_dump(cfg))
    capsys.readouterr()
    assert main(["run", str(path)]) == 0
    out = capsys.readouterr().out
    again = json.loads((run_dir / "summary.json").read_text())
    assert again["data"]["clusters"]["pools_reusing_embeddings"] == 1 and again["data"]["clusters"]["groups"] == 3
    assert again["selected"]  # the samples block below is printed only for a non-empty selection
    sizes = Counter(pq.read_table(run_dir / "clusters.parquet")["group"].to_pylist())
    shown = out.split("what the selected clusters hold", 1)[1].splitlines()[1:1 + len(again["selected"])]
    assert [line.split(" (")[0].strip() for line in shown] == again["selected"]
    assert all(f"({sizes[g]} examples)" in line for g, line in zip(again["selected"], shown))
    assert sorted(pq.read_table(run_dir / "scores.parquet")["group"].to_pylist()) == ["flat/c0", "flat/c1", "flat/c2"]
    # a later run in the folder without a flat pool leaves no stale clusters.parquet behind
    run(config_from_dict(data | {"name": "flat", "finetune": {"enabled": False}}))
    assert not (run_dir / "clusters.parquet").exists()
