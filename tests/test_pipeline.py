"""The whole run on a real local Ray cluster with a tiny real Llama and real chatterbot text."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import own_copy, snapshot, tiny_run_config

from convalue.engine.config import ConfigError, config_from_dict
from convalue.engine.data.examples import DataError
from convalue.engine.driver.pipeline import run
from convalue.engine.driver.resolve import resolve
from convalue.engine.model.loading import ModelError
from convalue.engine.store.vectors import StoreError

pytestmark = pytest.mark.heavy  # whole runs: scheduled before the light modules (conftest.py)

COLUMNS = ["group", "n_examples", "n_preview", "score", "beta", "cosine", "rank", "selected"]


def test_outputs_are_complete_and_consistent(first_run):
    tmp, data, summary = first_run
    run_dir = tmp / "runs" / "t"
    assert summary.status == "complete"
    table = pq.read_table(run_dir / "scores.parquet")
    assert table.column_names == COLUMNS
    assert sorted(table.column("group").to_pylist()) == ["english", "german", "hindi", "italian", "spanish"]
    assert table.column("rank").to_pylist() == [1, 2, 3, 4, 5]
    K, beta = np.load(run_dir / "gram.npy"), np.load(run_dir / "beta.npy")
    assert K.shape == (5, 5) and beta.shape == (5,)
    on_disk = json.loads((run_dir / "summary.json").read_text())
    assert on_disk["status"] == "complete" and on_disk["solver"]["kkt"] < 1e-6
    assert set(on_disk["timings_s"]) >= {"model", "data", "featurize", "gram", "solve", "finetune", "total"}
    assert on_disk["featurize"]["tokens"] > 0 and on_disk["packages"]["ray"]
    manifest = json.loads((run_dir / "vectors" / "manifest.json").read_text())
    assert manifest["complete"] and manifest["fingerprint"]["projection"] == data["projection"]
    assert on_disk["solver"]["rank_bound"] == manifest["dim"] == data["projection"]["dim"]  # rank(K) <= p, told the solver
    assert all(s > 0 for s in table.filter(table.column("selected")).column("score").to_pylist())
    # the progress actor saw every stage end and every item: the 5 groups and the target, each fine-tune
    progress = on_disk["progress"]
    assert progress["featurize"] == {"done": 6, "total": 6, "seconds": on_disk["timings_s"]["featurize"]}
    tuned = on_disk["evaluation"]["fine_tunes"]["trained"] + on_disk["evaluation"]["fine_tunes"]["reused"]
    assert progress["finetune"]["done"] == progress["finetune"]["total"] == tuned > 0
    assert set(progress) >= {"ray_init", "featurize", "gram", "solve", "finetune"}


def test_evaluation_protocol_fine_tunes_every_method_at_every_k(first_run):
    """Alg. 1 over K = {1, 2}: KMM, alignment and random at each k, target only once; best k, Borda, the files."""
    tmp, _, _ = first_run
    run_dir = tmp / "runs" / "t"
    on_disk = json.loads((run_dir / "summary.json").read_text())
    rows = on_disk["finetune"]
    assert [(r["method"], r["k"]) for r in rows] == [("kmm", 1), ("kmm", 2), ("alignment", 1), ("alignment", 2),
                                                     ("random", 1), ("random", 2), ("target_only", None)]
    assert [r["label"] for r in rows][:2] == ["target + KMM top-1", "target + KMM top-2"]
    assert rows[0]["base_val_loss"] > 0 and rows[-1]["aux_steps"] == 0 and rows[-1]["groups"] == []
    by = {(r["method"], r["k"]): r for r in rows}
    ranked = pq.read_table(run_dir / "scores.parquet").to_pylist()  # by rank: KMM's buying order
    by_beta = sorted(ranked, key=lambda r: -r["beta"])
    for k in (1, 2):
        assert by["kmm", k]["groups"] == sorted([r["group"] for r in ranked if r["score"] > 0][:k])
        assert by["alignment", k]["groups"] == sorted([r["group"] for r in by_beta if r["beta"] > 0][:k])
        assert len(by["random", k]["groups"]) == k
    assert by["kmm", 2]["groups"] == sorted(on_disk["selected"])  # select.k = 2 is one of the budgets
    for a in rows:  # the same groups train the same model once: equal losses
        for b in rows:
            if a["groups"] == b["groups"]:
                assert a["val_loss"] == b["val_loss"]
    ev = on_disk["evaluation"]
    assert ev["ks"] == [1, 2] and ev["methods"] == ["kmm", "alignment", "random"]
    assert sum(ev["borda"].values()) == pytest.approx(2 * 3)  # three methods, two budgets: 3 points per k
    for m in ev["methods"]:
        assert ev["best_k"][m]["val_loss"] == min(by[m, k]["val_loss"] for k in (1, 2))
        assert sum(by[m, k]["best"] for k in (1, 2)) == 1
    assert ev["target_only_val_loss"] == rows[-1]["val_loss"] and ev["base_val_loss"] == rows[0]["base_val_loss"]
    table = pq.read_table(run_dir / "evaluation.parquet").to_pylist()
    assert [(r["method"], r["k"], r["val_loss"], r["groups"]) for r in table] == [
        (r["method"], r["k"], r["val_loss"], r["groups"]) for r in rows]
    for name in ("scores.png", "evaluation.png"):
        assert (run_dir / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_wider_evaluation_trains_only_the_new_selections(first_run, tmp_path):
    """Rerunning with one more budget reads the stored vectors and fine-tunes back; only new selections train."""
    _, data, first = first_run
    own_copy(first_run, tmp_path / "runs" / "t")
    wider = data | {"out": str(tmp_path / "runs"), "finetune": data["finetune"] | {"ks": [1, 2, 3]}}
    out = run(config_from_dict(wider))
    assert out.featurize["groups_computed"] == 0
    old = {(r["method"], r["k"]): r for r in first.finetune}
    new = {(r["method"], r["k"]): r for r in out.finetune}
    assert set(new) == set(old) | {("kmm", 3), ("alignment", 3), ("random", 3)}
    for cell, r in old.items():  # the same selection, read back: the same loss, not trained again
        assert new[cell]["reused"] and new[cell]["groups"] == r["groups"] and new[cell]["val_loss"] == r["val_loss"]
    trained_before = {tuple(r["groups"]) for r in old.values()}
    fresh = {tuple(r["groups"]) for r in new.values()} - trained_before
    assert fresh and out.evaluation["fine_tunes"] == {"trained": len(fresh), "reused": len(trained_before)}
    assert all(r["reused"] == (tuple(r["groups"]) in trained_before) for r in new.values())
    assert {r["base_val_loss"] for r in out.finetune} == {first.finetune[0]["base_val_loss"]}


def test_repeats_add_seeds_and_report_each_cells_mean_and_spread(first_run, tmp_path):
    """finetune.repeats = 2 on the first run's folder: seed 0 is read back, seed 1 trains every selection again
    under its own draws, the random baseline on its own order; the cells are summarised by mean and sd (paper
    App., multi-seed results). Then random_orders `one`: seed 1 trains only seed 0's random selections."""
    from convalue.engine.protocol.evaluate import method_scores, plan_runs

    _, data, first = first_run
    run_dir = own_copy(first_run, tmp_path / "runs" / "t")
    out = run(config_from_dict(data | {"out": str(tmp_path / "runs"),
                                       "finetune": data["finetune"] | {"repeats": 2}}))
    rows, ev = out.finetune, out.evaluation
    assert [(r["method"], r["k"], r["seed"]) for r in rows] == [
        (r["method"], r["k"], s) for r in first.finetune for s in (0, 1)]
    seed0 = {(r["method"], r["k"]): r for r in rows if r["seed"] == 0}
    seed1 = {(r["method"], r["k"]): r for r in rows if r["seed"] == 1}
    names, beta = out.order, np.load(run_dir / "beta.npy")
    order1 = {r.k: r.groups for r in plan_runs(names, method_scores(["random"], beta, beta, beta, seed=1), beta,
                                               [1, 2], target_only=False)}
    for r in first.finetune:
        cell = r["method"], r["k"]
        assert seed0[cell]["reused"] and seed0[cell]["val_loss"] == r["val_loss"]
        assert seed1[cell]["groups"] == (list(order1[r["k"]]) if r["method"] == "random" else r["groups"])
        assert not seed1[cell]["reused"]
    assert any(seed1["random", k]["groups"] != seed0["random", k]["groups"] for k in (1, 2))  # its own order
    assert any(seed1[c]["val_loss"] != seed0[c]["val_loss"] for c in seed0)  # other draws, another model
    jobs0 = {tuple(r["groups"]) for r in first.finetune}
    jobs1 = {tuple(r["groups"]) for r in seed1.values()}
    assert ev["fine_tunes"] == {"trained": len(jobs1), "reused": len(jobs0)} and ev["seeds"] == [0, 1]
    assert [(d["method"], d["k"], d["seeds"]) for d in ev["kmm_minus"]] == [
        (m, k, 2) for m in ("alignment", "random", "target_only") for k in (1, 2)]
    for m, best in ev["best_k"].items():
        a, b = seed0[m, best["k"]]["val_loss"], seed1[m, best["k"]]["val_loss"]
        assert best["val_loss"] == pytest.approx((a + b) / 2) and best["val_loss_sd"] == pytest.approx(abs(a - b) / 2 ** 0.5)
    table = pq.read_table(tmp_path / "runs" / "t" / "evaluation.parquet")
    assert table.column("seed").to_pylist() == [r["seed"] for r in rows]
    tasks = len(jobs0) + len(jobs1)
    assert out.progress["finetune"] == out.progress["finetune"] | {"done": tasks, "total": tasks}
    one = run(config_from_dict(data | {"out": str(tmp_path / "runs"),
                                       "finetune": data["finetune"] | {"repeats": 2, "random_orders": "one"}}))
    again = {(r["method"], r["k"], r["seed"]): r for r in one.finetune}
    for m, k in seed1:  # seed 1 buys seed 0's random selections, trained under seed 1's draws
        assert again[m, k, 1]["groups"] == seed0[m, k]["groups"]
        assert again[m, k, 1]["reused"] == (tuple(seed0[m, k]["groups"]) in jobs1)
    assert one.evaluation["fine_tunes"]["trained"] == len(jobs0 - jobs1)


def test_softmax_mixture_weighs_each_bought_group_by_its_score(first_run, tmp_path):
    """finetune.mixture = softmax (paper App., auxiliary weighting) on the first run's folder: a run of two or more
    groups draws them by the softmax of its method's scores and trains anew; single groups and random's runs are
    the uniform fine-tunes, read back."""
    _, data, first = first_run
    own_copy(first_run, tmp_path / "runs" / "t")
    out = run(config_from_dict(data | {"out": str(tmp_path / "runs"),
                                       "finetune": data["finetune"] | {"mixture": "softmax"}}))
    ranked = {r["group"]: r for r in pq.read_table(tmp_path / "runs" / "t" / "scores.parquet").to_pylist()}
    column = {"kmm": "score", "alignment": "beta"}
    before = {(r["method"], r["k"]): r for r in first.finetune}
    mixed = 0
    for r in out.finetune:
        assert r["groups"] == before[r["method"], r["k"]]["groups"]
        if len(r["groups"]) > 1 and r["method"] != "random":
            s = np.array([ranked[g][column[r["method"]]] for g in r["groups"]])
            assert list(r["weights"].values()) == pytest.approx(list(np.exp(s) / np.exp(s).sum()))
            assert not r["reused"]
            mixed += 1
        else:
            assert r["weights"] is None and r["reused"] and r["val_loss"] == before[r["method"], r["k"]]["val_loss"]
    assert mixed > 0
    table = pq.read_table(tmp_path / "runs" / "t" / "evaluation.parquet")
    assert table.column("weights").null_count == len(out.finetune) - mixed


def test_given_mixture_and_rho_k_train_what_they_change(first_run, tmp_path):
    """finetune.mixture `given` (the paper's popularity weights) and rho_by_k (Alg. 1's rho_k) on the first run's
    folder: k = 1 trains anew under its rho_k, a two-group run with unequal given weights trains anew drawn by them,
    and the rest are read back; weights naming a group that is not a candidate, or leaving one out without
    mixture_default_weight, are refused before any work. The run names two groups and gives the rest the default."""
    from convalue.engine.protocol.finetune import mixing_schedule

    _, data, first = first_run
    run_dir = own_copy(first_run, tmp_path / "runs" / "t")
    given = {"english": 3.0, "spanish": 1.0, "german": 1.0, "hindi": 2.0, "italian": 1.0}
    tuned = data["finetune"] | {"rho_by_k": {1: 0.25}, "mixture": "given"}
    with pytest.raises(ConfigError, match="finetune.mixture_weights.hindu: names 1 group"):
        run(config_from_dict(data | {"out": str(tmp_path / "runs"),
                                     "finetune": tuned | {"mixture_weights": given | {"hindu": 1.0}}}))
    named = {"english": 3.0, "hindi": 2.0}  # the others get the default, 1.0: the weights of `given`
    with pytest.raises(ConfigError, match="3 have none"):
        run(config_from_dict(data | {"out": str(tmp_path / "runs"), "finetune": tuned | {"mixture_weights": named}}))
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "complete"  # the folder is untouched
    out = run(config_from_dict(data | {"out": str(tmp_path / "runs"), "finetune": tuned | {
        "mixture_weights": named, "mixture_default_weight": 1.0}}))
    before = {(r["method"], r["k"]): r for r in first.finetune}
    steps, mixed = data["finetune"]["steps"], 0
    for r in out.finetune:
        old = before[r["method"], r["k"]]
        assert r["groups"] == old["groups"]
        if r["k"] == 1:
            assert r["rho"] == 0.25 and r["weights"] is None and not r["reused"]
            plan = mixing_schedule(steps, 0.25, 1, seed=0)
            assert r["target_steps"] == sum(s < 0 for s in plan)
        elif r["method"] == "target_only":
            assert r["rho"] == 1.0 and r["reused"] and r["val_loss"] == old["val_loss"]
        elif len({given[g] for g in r["groups"]}) > 1:
            total = sum(given[g] for g in r["groups"])
            assert r["weights"] == pytest.approx({g: given[g] / total for g in r["groups"]})
            assert r["rho"] == 0.5 and not r["reused"]
            mixed += 1
        else:
            assert r["weights"] is None and r["reused"] and r["val_loss"] == old["val_loss"]
    assert mixed > 0
    table = pq.read_table(run_dir / "evaluation.parquet")
    assert table.column("rho").to_pylist() == [r["rho"] for r in out.finetune]


def test_a_failed_protocol_lists_the_fine_tunes_it_has(first_run, tmp_path):
    """A fine-tune that fails stops the protocol the solver actor dispatches; the failed summary lists what was done
    (here the stored ones), and counts it in `progress`."""
    import ray

    from convalue.actors.evaluation import Runners
    from convalue.actors.pool import WorkItemError

    _, data, first = first_run
    own_copy(first_run, tmp_path / "runs" / "t")

    @ray.remote(max_retries=0)
    def failing_finetune(spec, label, *rest):
        raise RuntimeError(f"no memory for {label}")

    run_dir = tmp_path / "runs" / "t"
    before = snapshot(run_dir)
    wider = data | {"out": str(tmp_path / "runs"), "finetune": data["finetune"] | {"ks": [1, 2, 3]}}
    with pytest.raises(WorkItemError, match="no memory for target \\+"):
        run(config_from_dict(wider), runners=Runners(finetune=failing_finetune))
    assert snapshot(run_dir) == before  # the finished run stays as it was; the attempt's summary is staged
    summary = json.loads((run_dir / ".staging" / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["failed_stage"] == "finetune"
    stored = {tuple(r["groups"]): r["val_loss"] for r in first.finetune}
    listed = summary["finetune_finished"]
    assert {tuple(r["groups"]): r["val_loss"] for r in listed} == stored
    assert all(r["reused"] and r["seed"] == 0 for r in listed)
    assert summary["progress"]["finetune"]["done"] == len(stored) < summary["progress"]["finetune"]["total"]


def test_a_rerun_with_every_fine_tune_stored_evaluates_only_a_missing_base(first_run, tmp_path):
    """All fine-tunes read back; the base model's loss, its record removed, comes from a base-evaluation task."""
    _, data, first = first_run
    own_copy(first_run, tmp_path / "runs" / "t")
    records = list((tmp_path / "runs" / "t" / "finetunes").glob("*.json"))
    base_records = [p for p in records if set(json.loads(p.read_text())) == {"base_val_loss", "key"}]
    assert len(base_records) == 1
    base_records[0].unlink()
    out = run(config_from_dict(data | {"out": str(tmp_path / "runs")}))
    assert out.evaluation["fine_tunes"]["trained"] == 0
    assert out.evaluation["base_val_loss"] == first.finetune[0]["base_val_loss"]  # the same evaluation
    assert base_records[0].is_file()  # stored again


def test_same_seed_same_scores_with_two_workers_and_other_blocks(first_run, tmp_path):
    tmp, data, _ = first_run  # the first run: one worker, two groups a call
    other = data | {"name": "t1", "out": str(tmp_path), "finetune": {"enabled": False},
                    "ray": {"workers": 2, "cpus_per_worker": 1, "groups_per_call": 3}}
    run(config_from_dict(other))
    a = {r["group"]: r for r in pq.read_table(tmp / "runs" / "t" / "scores.parquet").to_pylist()}
    b = {r["group"]: r for r in pq.read_table(tmp_path / "t1" / "scores.parquet").to_pylist()}
    for g in a:
        assert b[g]["beta"] == pytest.approx(a[g]["beta"], rel=1e-5)
        assert b[g]["score"] == pytest.approx(a[g]["score"], abs=1e-6)
    np.testing.assert_allclose(np.load(tmp_path / "t1" / "gram.npy"), np.load(tmp / "runs" / "t" / "gram.npy"),
                               rtol=1e-5)


def test_rerun_resumes_from_stored_vectors(first_run, tmp_path):
    from convalue.engine.protocol.verdict import not_evaluated

    _, data, _ = first_run
    run_dir = own_copy(first_run, tmp_path / "runs" / "t")
    again = run(config_from_dict(data | {"out": str(tmp_path / "runs"), "finetune": {"enabled": False}}))
    assert again.featurize["groups_computed"] == 0 and again.featurize["groups_reused"] == 6
    assert again.status == "complete"
    # the first run's fine-tune results are not left beside the new scores
    assert not (run_dir / "evaluation.parquet").exists() and not (run_dir / "evaluation.png").exists()
    assert (run_dir / "scores.png").is_file() and again.finetune is None
    assert again.evaluation == {"verdict": not_evaluated().to_dict()}  # no fine-tune: the ranking stands alone


def test_bad_data_fails_before_writing_anything(ray_session, tiny_model_dir, tmp_path):
    from conftest import write_jsonl

    target = write_jsonl(tmp_path / "t.jsonl", [{"prompt": "a", "response": "b"}] * 6)
    pool = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "a", "answer": "b", "group": "x"}])
    with pytest.raises(DataError, match=r"p.jsonl:1: missing field\(s\) \['response'\]"):
        run(config_from_dict(tiny_run_config(tmp_path, tiny_model_dir, target, pool)))
    assert not (tmp_path / "runs").exists()


def test_bf16_on_cpu_workers_is_warned_at_the_start(tiny_model_dir, tmp_path, caplog):
    """bf16 on CPU workers is allowed but 20-28x slower here: the run says so before it does anything."""
    from conftest import write_jsonl

    target = write_jsonl(tmp_path / "t.jsonl", [{"prompt": "a", "response": "b"}] * 6)
    pool = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "a", "answer": "b", "group": "x"}])  # fails in data
    for dtype, warned in (("bfloat16", True), ("float32", False)):
        caplog.clear()
        cfg = tiny_run_config(tmp_path, tiny_model_dir, target, pool, model={"dtype": dtype})
        with caplog.at_level("WARNING", logger="convalue"), pytest.raises(DataError):
            run(config_from_dict(cfg))
        assert ("bfloat16 on CPU workers" in caplog.text) == warned


def test_failure_mid_run_leaves_no_complete_looking_result(ray_session, tiny_model_dir, tmp_path):
    """A replica the workers cannot build (LoRA on a norm layer, which peft refuses) fails the featurize stage
    once, with the worker's own error, and leaves a failed summary and no scores."""
    from conftest import chatterbot_pairs, write_jsonl

    from convalue.actors.pool import WorkItemError

    target = write_jsonl(tmp_path / "t.jsonl", chatterbot_pairs("marathi", 8))
    pool = write_jsonl(tmp_path / "p.jsonl", [r | {"group": "en"} for r in chatterbot_pairs("english", 4)])
    cfg = tiny_run_config(tmp_path, tiny_model_dir, target, pool, lora={"target_modules": ["input_layernorm"]},
                          select={"k": 1})
    with pytest.raises(WorkItemError, match="gradient worker start-up") as err:
        run(config_from_dict(cfg))
    assert isinstance(err.value.cause, ModelError) and "is not supported" in str(err.value.cause)
    run_dir = tmp_path / "runs" / "t"
    assert not (run_dir / "scores.parquet").exists() and not (run_dir / "gram.npy").exists()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["failed_stage"] == "featurize"
    assert summary["progress"]["featurize"]["done"] == 0 and summary["progress"]["featurize"]["total"] == 2


def test_unknown_lora_module_is_refused_before_ray_or_the_run_folder(tiny_model_dir, tmp_path):
    from conftest import chatterbot_pairs, write_jsonl

    target = write_jsonl(tmp_path / "t.jsonl", chatterbot_pairs("marathi", 8))
    pool = write_jsonl(tmp_path / "p.jsonl", [r | {"group": "en"} for r in chatterbot_pairs("english", 4)])
    cfg = tiny_run_config(tmp_path, tiny_model_dir, target, pool, lora={"target_modules": ["q_proj", "no_such_proj"]})
    with pytest.raises(ModelError, match=r"lora.target_modules \['no_such_proj'\] not found"):
        run(config_from_dict(cfg))
    assert not (tmp_path / "runs").exists()


def test_a_run_says_running_until_it_ends(ray_session, tiny_model_dir, tmp_path, monkeypatch):
    """summary.json says "running" from the moment the folder is cleared, so a run killed midway (no `finally`)
    never leaves results that look finished; a re-solve of such a folder is refused."""
    from conftest import chatterbot_pairs, write_jsonl

    import convalue.engine.driver.stages as stages

    target = write_jsonl(tmp_path / "t.jsonl", chatterbot_pairs("marathi", 8))
    pool = write_jsonl(tmp_path / "p.jsonl", [r | {"group": "en"} for r in chatterbot_pairs("english", 4)])
    run_dir = tmp_path / "runs" / "t"
    seen = {}

    def featurize(*args, **kwargs):
        seen.update(json.loads((run_dir / "summary.json").read_text()))
        raise RuntimeError("stopped in featurize")

    monkeypatch.setattr(stages, "featurize", featurize)  # a stop in the stage, at a known moment
    with pytest.raises(RuntimeError, match="stopped in featurize"):
        run(config_from_dict(tiny_run_config(tmp_path, tiny_model_dir, target, pool, select={"k": 1})))
    assert seen["status"] == "running" and seen["data"]["candidates"] == 1
    (run_dir / "summary.json").write_text(json.dumps(seen))  # what a killed run leaves
    with pytest.raises(StoreError, match=r"field `status` is \"running\""):
        resolve(run_dir, gamma=0.01, budget=None, method=None, normalize=None)


def test_a_run_folder_in_use_is_refused_and_left_untouched(first_run, tmp_path):
    """While one process runs or re-solves in a folder, another run or re-solve there stops before writing."""
    from convalue.engine.files.locks import exclusive

    _, data, _ = first_run
    run_dir = tmp_path / "runs" / "t"
    own_copy(first_run, run_dir)

    def snapshot():
        return {str(f.relative_to(run_dir)): f.read_bytes() for f in sorted(run_dir.rglob("*")) if f.is_file()}

    before = snapshot()
    with exclusive(run_dir):  # what a running convalue process holds
        with pytest.raises(StoreError, match="in use by another convalue process"):
            resolve(run_dir, gamma=0.01, budget=None, method=None, normalize=None)
        with pytest.raises(StoreError, match="in use by another convalue process"):
            run(config_from_dict(data | {"out": str(tmp_path / "runs")}))
        assert snapshot() == before
    assert resolve(run_dir, gamma=0.01, budget=None, method=None, normalize=None).resolved  # released
    with pytest.raises(FileNotFoundError, match=r"not a finished run folder \(no such folder\)"):
        resolve(tmp_path / "absent", gamma=0.01, budget=None, method=None, normalize=None)
    assert not (tmp_path / "absent").exists()


def test_an_unreachable_cluster_address_fails_fast_before_any_stage(first_run, ray_session, tmp_path):
    """A typo in --address is one clear line in seconds; ray.init alone retries for minutes with warnings."""
    import socket
    import subprocess
    import sys

    import yaml

    from convalue.engine.driver.session import ClusterError, check_reachable

    check_reachable(ray_session.get_runtime_context().gcs_address, "--address")  # the session's cluster listens
    check_reachable("auto", "RAY_ADDRESS")  # a form Ray resolves itself is left to Ray
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    with pytest.raises(ClusterError, match=rf"cannot reach a Ray cluster at 127.0.0.1:{port} \(given by ray.address\)"):
        check_reachable(f"127.0.0.1:{port}", "ray.address")
    _, data, _ = first_run
    path = tmp_path / "away.yaml"
    path.write_text(yaml.safe_dump(data | {"out": str(tmp_path / "runs"), "name": "away"}))
    r = subprocess.run([sys.executable, "-m", "convalue", "run", str(path), "--address", f"127.0.0.1:{port}"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and f"cannot reach a Ray cluster at 127.0.0.1:{port} (given by --address)" in r.stderr
    assert "stage model" not in r.stderr and not (tmp_path / "runs").exists()


def test_cli_joins_an_existing_cluster_by_address(first_run, ray_session, tiny_model_dir):
    """`convalue run --address` from another process: a second driver on the session's running cluster."""
    import subprocess
    import sys

    import yaml

    tmp, data, _ = first_run
    gcs = ray_session.get_runtime_context().gcs_address
    cfg = data | {"name": "joined", "finetune": {"enabled": False}}
    path = tmp / "joined.yaml"
    path.write_text(yaml.safe_dump(cfg))
    r = subprocess.run([sys.executable, "-m", "convalue", "run", str(path), "--address", gcs],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "ray_init" in r.stdout and "rank  group" in r.stdout
    # gram.npy of the first run is never rewritten by re-solving (its scores may be, by other tests)
    np.testing.assert_allclose(np.load(tmp / "runs" / "joined" / "gram.npy"), np.load(tmp / "runs" / "t" / "gram.npy"),
                               rtol=1e-5)
    # the same run folder with other projection settings: refused, then replaced with --overwrite
    path.write_text(yaml.safe_dump(cfg | {"projection": cfg["projection"] | {"seed": 1}}))
    r = subprocess.run([sys.executable, "-m", "convalue", "run", str(path), "--address", gcs],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 2 and "made with other settings (differs in ['projection'])" in r.stderr
    r = subprocess.run([sys.executable, "-m", "convalue", "run", str(path), "--address", gcs, "--overwrite"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    manifest = json.loads((tmp / "runs" / "joined" / "vectors" / "manifest.json").read_text())
    assert manifest["fingerprint"]["projection"]["seed"] == 1 and manifest["complete"]


def test_cost_weighted_budget_from_a_prices_file(first_run):
    tmp, data, _ = first_run
    prices = {"english": 5.0, "spanish": 1.0, "german": 1.0, "hindi": 0.5, "italian": 2.0}
    path = tmp / "prices.json"
    path.write_text(json.dumps(prices))
    cfg = data | {"name": "priced", "solver": {"budget": 0.5, "costs_file": str(path), "normalize": "cosine"},
                  "finetune": {"enabled": False}}
    summary = run(config_from_dict(cfg))
    run_dir = tmp / "runs" / "priced"
    assert summary.solver.form == "cost_budget" and summary.solver.status == "optimal"
    rows = pq.read_table(run_dir / "scores.parquet").to_pylist()
    assert sum(prices[r["group"]] * abs(r["score"]) for r in rows) <= 0.5 + 1e-6
    again = resolve(run_dir, gamma=None, budget=None, method=None, normalize=None)  # reuses costs.npy
    assert again.solver.form == "cost_budget"


def test_prices_file_errors(tmp_path):
    from convalue.engine.data.costs import load_costs

    p = tmp_path / "c.json"
    p.write_text(json.dumps({"a": 1.0, "b": -2}))
    with pytest.raises(DataError, match="no price for group"):
        load_costs(p, ["a", "c"])
    with pytest.raises(DataError, match="price of group 'b' must be a finite number > 0, got -2"):
        load_costs(p, ["a", "b"])
    # a group priced twice is refused, not settled silently by whichever row comes last
    p.write_text('{"a": 1.0, "b": 2.0, "a": 3.0}')
    with pytest.raises(DataError, match=r"c.json: group 'a' has two prices \(1.0 and 3.0\)"):
        load_costs(p, ["a", "b"])
    pq.write_table(pa.table({"group": ["a", "b", "b"], "cost": [1.0, 2.0, 2.5]}), tmp_path / "c.parquet")
    with pytest.raises(DataError, match=r"c.parquet: group 'b' has two prices \(2.0 and 2.5\)"):
        load_costs(tmp_path / "c.parquet", ["a", "b"])
    for bad, why in [(b"[[\"a\", 1.0]]", "expected a JSON object"), (b'{"a": 1.0, "b": 2.0\xff}', "not UTF-8 text")]:
        p.write_bytes(bad)
        with pytest.raises(DataError, match=why):
            load_costs(p, ["a", "b"])
    (tmp_path / "junk.parquet").write_bytes(b"junk")
    with pytest.raises(DataError, match="junk.parquet: not a readable Parquet file"):
        load_costs(tmp_path / "junk.parquet", ["a"])
    pq.write_table(pa.table({"group": ["a", "b"], "cost": [1.0, 0.5]}), tmp_path / "c.parquet")
    assert load_costs(tmp_path / "c.parquet", ["b", "a"]).tolist() == [0.5, 1.0]
    p.write_text('{"a": 1, "b": 2.5}')
    assert load_costs(p, ["a", "b"]).tolist() == [1.0, 2.5]


def test_status_tells_a_live_run_from_an_interrupted_one(first_run, tmp_path, capsys):
    """`convalue status`: complete (exit 0); a summary that says "running" with no process holding the folder is
    an interrupted run (exit 1, with how to resume); the same while a process holds the folder's lock is a live
    run (exit 3); a failed run names its stage and error (exit 1); an unreadable summary is damage (exit 1)."""
    from convalue.engine.driver.cli import main
    from convalue.engine.files.locks import exclusive
    from convalue.engine.store.status import VectorsState, run_status

    _, data, first = first_run
    run_dir = own_copy(first_run, tmp_path / "runs" / "t")
    summary = json.loads((run_dir / "summary.json").read_text())
    status = run_status(run_dir)
    assert status.state == "complete" and not status.live_process and status.problems == []
    assert status.vectors == VectorsState(stored=6, needed=6, target=True, complete=True,  # 5 groups, the target
                                          damaged=[], verified="checksums")
    records = [json.loads(p.read_text()) for p in (run_dir / "finetunes").glob("*.json")]
    assert status.finetune_records == sum("val_loss" in r for r in records) >= len(
        {tuple(r["groups"]) for r in first.finetune})  # finetunes/ keeps the first run's fine-tunes
    assert status.selected == summary["selected"]
    assert status.best_k == (summary.get("evaluation") or {}).get("best_k")
    assert main(["status", str(run_dir)]) == 0
    assert f"{run_dir}: complete" in capsys.readouterr().out

    started = {k: summary[k] for k in ("config", "packages", "data")} | {"status": "running"}  # as a run begins
    (run_dir / "summary.json").write_text(json.dumps(started))
    assert main(["status", str(run_dir)]) == 1
    out = capsys.readouterr().out
    assert f"{run_dir}: interrupted" in out and "no process holds the folder" in out and "resume" in out
    with exclusive(run_dir):  # a run writing the folder now
        assert main(["status", str(run_dir), "--json"]) == 3
        live = json.loads(capsys.readouterr().out)
    assert live["state"] == "running" and live["live_process"] and live["selected"] is None

    failed = started | {"status": "failed", "failed_stage": "finetune", "error": "RuntimeError: no memory"}
    (run_dir / "summary.json").write_text(json.dumps(failed))
    assert main(["status", str(run_dir)]) == 1
    assert "failed in stage finetune: RuntimeError: no memory" in capsys.readouterr().out
    (run_dir / "summary.json").write_text("{")
    assert main(["status", str(run_dir)]) == 1
    assert "summary.json: not readable JSON" in capsys.readouterr().out


def test_report_and_list_read_a_finished_run(first_run, tmp_path, capsys):
    """Every run leaves report.html; `convalue report` writes it again, `convalue list` names the run's picks."""
    from convalue.engine.driver.cli import main

    _, _, summary = first_run
    run_dir = own_copy(first_run, tmp_path / "runs" / "t")
    page = (run_dir / "report.html").read_text()
    assert "<table" in page and "data:image/png;base64," in page and summary.selected[0] in page
    (run_dir / "report.html").unlink()
    assert main(["report", str(run_dir)]) == 0 and (run_dir / "report.html").is_file()
    assert capsys.readouterr().out.strip() == str(run_dir / "report.html")
    assert main(["list", str(tmp_path / "runs")]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert listed[1].split()[:2] == ["t", "complete"] and summary.selected[0] in listed[1]
