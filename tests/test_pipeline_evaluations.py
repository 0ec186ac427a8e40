"""Evaluation protocols on runs that need only the pipeline tests' config: two representations in one evaluation
(and task vectors alone), the DataModel, regularisation-path and GradEx baselines, accuracy on a mathematics task,
GRPO fine-tunes. A module of their own so that pytest-xdist can run them beside tests/test_pipeline.py and
tests/test_pipeline_config_runs.py (`--dist loadfile` gives each file to one worker).

Each run starts its own progress, gradient-worker and solver actors (a gradient worker: about 5 s of CPU importing
torch, transformers and peft), which cost far more than its few small fine-tunes; so the checks that do not contend
read one shared run (`shared_run`): task vectors alone, the regularisation path and every fitted baseline."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from convalue.engine.config import config_from_dict
from convalue.engine.driver.pipeline import run

pytestmark = pytest.mark.heavy  # whole runs: scheduled before the light modules (conftest.py)


@pytest.fixture(scope="module")
def evaluation_config(pipeline_config):
    """The pipeline tests' (folder, config data) with one call in flight: the fine-tunes and GradEx's tasks run one
    after another in one task process, which imports torch once, where two in flight start two such processes."""
    tmp, data = pipeline_config
    return tmp, data | {"ray": data["ray"] | {"max_in_flight": 1}}


@pytest.fixture(scope="module")
def shared_run(evaluation_config):
    """(config data, summary) of the run four tests read: task vectors alone (the run's one representation, one
    step on each group's preview), valued along the whole regularisation path, with every fitted baseline (DataModel
    on both designs, GradEx-FS and -RE) ranked beside KMM; fine-tuned at k = 1 and 2."""
    tmp, data = evaluation_config
    cfg = data | {"name": "shared",
                  "features": {"representation": "task_vector", "tv_steps": 1, "tv_batch_size": 2,
                               "tv_data": "preview_shortcut"},
                  "solver": data["solver"] | {"path": True, "path_points": 20},
                  "finetune": data["finetune"] | {
                      "ks": [1, 2], "steps": 2,
                      "baselines": ["target_only", "datamodel", "datamodel_cs", "gradex_fs", "gradex_re"],
                      "datamodel": {"runs_per_candidate": 1.0},
                      "gradex": {"projection_dim": 8, "draws_per_candidate": 2}}}
    return cfg, run(config_from_dict(cfg))


def test_two_representations_meet_in_one_evaluation(evaluation_config, shared_run):
    """One-step and task vectors (the paper's TV: a short fine-tune on the whole group, a quarter of the target
    fine-tune's steps) featurised and solved in one run; their cosine and KMM rankings share one table and Borda.
    Then task vectors alone (the run's one representation), as many steps on the previews instead."""
    tmp, data = evaluation_config
    cfg = data | {"name": "two", "features": {"representations": ["one_step", "task_vector"], "tv_batch_size": 2},
                  "finetune": data["finetune"] | {"ks": [1], "baselines": ["target_only"], "steps": 4}}
    summary = run(config_from_dict(cfg))
    assert summary.status == "complete" and set(summary.representations) == {"task_vector"}
    tv = summary.representations["task_vector"]
    assert tv["solver"]["status"] == "optimal" and tv["featurize"]["groups_computed"] == 6
    methods = summary.evaluation["methods"]
    assert {"kmm", "one_step", "tv", "tv+kmm"} <= set(methods) and set(summary.evaluation["borda"]) == set(methods)
    labels = {r["label"] for r in summary.finetune}
    assert "target + TV + KMM top-1" in labels and "target + One-Step top-1" in labels
    manifest = json.loads((tmp / "runs" / "two" / "vectors-task_vector" / "manifest.json").read_text())
    assert manifest["fingerprint"]["features"]["representation"] == "task_vector"
    assert manifest["fingerprint"]["features"]["tv_data"] == "group"
    preview = shared_run[1]  # task vectors alone, one step on each preview
    assert preview.status == "complete" and preview.featurize["dim_in"] > 0
    manifest = json.loads((tmp / "runs" / "shared" / "vectors" / "manifest.json").read_text())
    assert manifest["fingerprint"]["parameters"] == "lora_A+lora_B"
    assert manifest["fingerprint"]["features"]["representation"] == "task_vector"
    assert manifest["fingerprint"]["features"]["tv_data"] == "preview_shortcut"
    assert preview.featurize["groups_computed"] == 6 and preview.order == summary.order
    # the same single step on other data (the previews): other vectors, so another alignment with the target
    beta_group, beta_preview = (np.load(tmp / "runs" / name) for name in ("two/beta-tv.npy", "shared/beta.npy"))
    assert beta_group.shape == beta_preview.shape == (5,) and not np.allclose(beta_preview, beta_group)


def test_the_regularisation_path_buys_every_k_and_is_drawn(evaluation_config, shared_run):
    tmp, data = evaluation_config
    from convalue.solvers import kmm_path

    summary = shared_run[1]
    run_dir = tmp / "runs" / "shared"
    table = pq.read_table(run_dir / "path.parquet")
    assert table.num_rows == 20 * len(summary.order) and (run_dir / "path.png").is_file()
    path = kmm_path(np.load(run_dir / "gram.npy"), np.load(run_dir / "beta.npy"), n_gammas=20,
                    normalize=data["solver"]["normalize"])
    for k in (1, 2):
        assert summary.path["bought"][str(k)] == [summary.order[i] for i in path.top_k(k)]
        row = next(r for r in summary.finetune if r["method"] == "kmm_path" and r["k"] == k)
        assert row["groups"] == sorted(summary.path["bought"][str(k)])
    assert "kmm_path" in summary.evaluation["borda"] and summary.path["max_kkt"] < 1e-6


def test_gradex_baselines_rank_from_the_log_odds_at_theta_star(evaluation_config, shared_run):
    """GradEx-FS and -RE: one multitask fine-tune theta*, per-example log-odds gradients there (projected), the
    logistic surrogate; both rank in the same table, and their cost says one fine-tune and how many gradients."""
    tmp, data = evaluation_config
    summary = shared_run[1]
    ev = summary.evaluation
    assert {"gradex_fs", "gradex_re"} <= set(ev["methods"])
    examples = summary.data["target_train"] + summary.data["target_val"] + 5 * data["data"]["preview_size"]
    for kind in ("gradex_fs", "gradex_re"):
        assert ev["cost"][kind]["fine_tunes"] == 1 and ev["cost"][kind]["gradient_examples"] == examples
    assert ev["cost"]["gradex_re"]["draws"] == 10


def test_datamodel_baselines_are_fitted_from_subset_fine_tunes_and_costed(evaluation_config, shared_run):
    """DataModel (uniform and compressed-sensing designs): subset fine-tunes, a LASSO fit, then ranked like KMM in
    the same table; the summary says what each method cost (KMM: no fine-tune). Last of the shared run's tests: it
    runs that folder again."""
    tmp, data = evaluation_config
    cfg, summary = shared_run
    ev = summary.evaluation
    assert {"kmm", "datamodel", "datamodel_cs"} <= set(ev["methods"]) and "datamodel" in ev["borda"]
    cost = ev["cost"]
    assert cost["kmm"]["fine_tunes"] == 0 and cost["kmm"]["tokens"] > 0
    assert cost["datamodel"]["fine_tunes"] >= 2 and cost["datamodel"]["design_rows"] == 5
    assert cost["datamodel_cs"]["design_rows"] == 2 and cost["datamodel_cs"]["seconds"] > 0
    records = [json.loads(f.read_text()) for f in (tmp / "runs" / "shared" / "finetunes").glob("*.json")]
    # every subset fine-tune is kept for a rerun: counted by the subset stage's labels, so the protocol's own
    # fine-tunes in the same folder do not make up for a missing one
    subsets = [r for r in records if r.get("label") == "target only" or str(r.get("label")).startswith("target + {")]
    assert len(subsets) >= cost["datamodel"]["fine_tunes"]
    # nothing trained twice: the DataModel run alone (k = 1, no path), each of its fine-tunes stored by the run above
    again = run(config_from_dict(cfg | {"solver": data["solver"], "finetune": cfg["finetune"] | {
        "ks": [1], "baselines": ["target_only", "datamodel", "datamodel_cs"]}}))
    assert again.evaluation["fine_tunes"]["trained"] == 0


def test_accuracy_on_a_mathematics_task_ranks_the_methods(evaluation_config):
    """finetune.metrics accuracy: every fine-tune (and the base model) measured by exact match of greedy
    completions on a mathematics task's validation split; best k and Borda on accuracy, the loss's beside."""
    tmp, data = evaluation_config
    maths = {"kind": "mathematics", "examples_per_group": 10}
    cfg = data | {"name": "acc",
                  "data": data["data"] | {"target": maths | {"include": ["arithmetic__add_or_sub"]},
                                          "candidates": [maths | {"include": ["arithmetic__mul", "numbers__gcd",
                                                                              "comparison__pair"]}]},
                  "finetune": data["finetune"] | {"ks": [1], "steps": 2, "baselines": ["target_only", "alignment"],
                                                  "metrics": ["loss", "accuracy"], "select_by": "accuracy",
                                                  "accuracy_max_new_tokens": 8}}
    summary = run(config_from_dict(cfg))
    ev = summary.evaluation
    by = {(e["evaluation"], e["metric"]): e for e in ev["evaluations"]}
    assert ev["metric"] == "accuracy" and set(by) == {("target_val", "loss"), ("target_val", "accuracy")}
    assert set(by["target_val", "loss"]) >= {"best_k", "borda", "kmm_minus"}
    assert all(0.0 <= r["val_accuracy"] <= 1.0 for r in summary.finetune)
    assert summary.finetune[0]["base_val_accuracy"] is not None
    assert ev["best_k"]["kmm"]["val_accuracy"] == next(r["val_accuracy"] for r in summary.finetune
                                                       if r["method"] == "kmm")


def test_grpo_fine_tunes_evaluate_a_grpo_valuation(evaluation_config):
    """finetune.objective `grpo`: the protocol's fine-tunes train by GRPO with the run's reward, in Ray tasks; each
    row records its per-step rewards beside the validation loss."""
    tmp, data = evaluation_config
    reward = Path(__file__).parent / "rewards_for_tests.py"
    cfg = data | {"name": "grpo_ft",
                  "features": {"representation": "grpo", "grpo_generations": 2, "grpo_max_new_tokens": 4,
                               "grpo_reward": f"{reward}:length"},
                  "finetune": data["finetune"] | {"objective": "grpo", "ks": [1], "steps": 2, "grpo_generations": 2,
                                                  "grpo_max_new_tokens": 4, "grpo_reward": f"{reward}:length",
                                                  "baselines": ["target_only"]}}
    summary = run(config_from_dict(cfg))
    assert summary.status == "complete"
    rows = pq.read_table(tmp / "runs" / "grpo_ft" / "evaluation.parquet").to_pylist()
    assert {r["method"] for r in rows} == {"kmm", "target_only"}
    for r in rows:
        assert r["objective"] == "grpo" and len(r["train_rewards"]) == 2 and np.isfinite(r["val_loss"])
        assert r["train_reward_first"] == r["train_rewards"][0] > 0  # `length` of a sampled completion
