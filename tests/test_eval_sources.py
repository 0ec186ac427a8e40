"""data.eval: named evaluations of any source kind beside the target's validation split; every fine-tune measured
on each; finetune.select_by (`EVAL:METRIC`) picks the one that decides best k, Borda and the verdict."""

from __future__ import annotations

import dataclasses
import json

import pyarrow.parquet as pq
import pytest
import yaml
from conftest import chatterbot_pairs, tiny_run_config, write_jsonl

from convalue.engine.config import (
    ConfigError,
    DataConfig,
    SourceConfig,
    config_from_dict,
    load_config,
)
from convalue.engine.data.examples import DataError
from convalue.engine.data.prepare import evaluation_sets, prepare
from convalue.engine.data.sources import split_target
from convalue.engine.protocol.measures import Measure
from convalue.engine.protocol.summaries import summarise_measure
from convalue.engine.report.tables import evaluation_table, format_evaluation

pytestmark = pytest.mark.heavy  # whole runs: scheduled before the light modules (conftest.py)

GREETINGS = {"kind": "chatterbot", "group_by": "language/topic", "include": ["marathi/greetings"]}


def _pairs(lang: str, start: int, stop: int) -> list[dict]:
    """Pairs start..stop of one chatterbot language (from conftest's reading of the corpus, made once a process)."""
    return chatterbot_pairs(lang, stop)[start:]


def test_data_eval_and_select_by_are_read_and_checked(tmp_path, target_jsonl, pool_jsonl):
    """A mapping of named sources (paths read against the config file's folder); select_by names one of them or
    target_val, a bare metric meaning target_val's; every bad value is refused naming its field."""
    write_jsonl(tmp_path / "held.jsonl", [{"prompt": "a", "response": "b"}])
    data = tiny_run_config(tmp_path, tmp_path, target_jsonl, pool_jsonl)
    data["model"]["source"] = "smollm2-135m-instruct"
    data["data"]["eval"] = {"greetings": GREETINGS, "held": {"kind": "jsonl", "path": "held.jsonl"}}
    data["finetune"] |= {"select_by": "held:loss"}
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(data))
    cfg = load_config(tmp_path / "run.yaml")
    assert list(cfg.data.eval) == ["greetings", "held"] and cfg.data.eval["held"].path == str(tmp_path / "held.jsonl")
    assert cfg.finetune.select_by_parts() == ("held", "loss")
    assert Measure.parse("loss") == Measure("target_val", "loss") and Measure.parse("held:accuracy").name == \
        "held:accuracy"
    assert config_from_dict(data | {"finetune": data["finetune"] | {"select_by": "accuracy", "metrics": [
        "loss", "accuracy"]}}, base=tmp_path).finetune.select_by_parts() == ("target_val", "accuracy")
    bad = [({"select_by": "nope:loss"}, None, "finetune.select_by", "neither `target_val` nor one of data.eval"),
           ({"select_by": "held:f1"}, None, "finetune.select_by", "METRIC one of"),
           ({"select_by": "held:accuracy"}, None, "finetune.metrics", "must list `loss` and select_by's"),
           ({}, {"target_val": GREETINGS}, "data.eval.target_val", "always evaluated"),
           ({}, {"a:b": GREETINGS}, "data.eval.a:b", "letters, digits"),
           ({}, {"pool": GREETINGS | {"clusters": 3}}, "data.eval.pool.clusters", "candidate sources only"),
           ({}, {"held": {"kind": "jsonl", "path": "missing.jsonl"}}, "data.eval.held.path", "not an existing file")]
    for finetune, evals, field, reason in bad:
        wrong = data | {"finetune": data["finetune"] | finetune,
                        "data": data["data"] | ({"eval": evals} if evals else {})}
        with pytest.raises(ConfigError, match=reason) as err:
            config_from_dict(wrong, base=tmp_path)
        assert err.value.field == field


def test_evaluations_are_loaded_apart_from_the_targets_training_data(tmp_path, smollm2_dir):
    """Each evaluation pools its source's groups; an example equal to a target training example leaves the
    evaluation with a warning; eval_size keeps a seeded sample; the target's validation split is `target_val`."""
    from convalue.engine.model.loading import load_tokenizer

    tok = load_tokenizer(smollm2_dir)
    target = write_jsonl(tmp_path / "marathi.jsonl", _pairs("marathi", 0, 12))
    pool = write_jsonl(tmp_path / "pool.jsonl", [r | {"g": "hindi"} for r in _pairs("hindi", 0, 6)])
    held = write_jsonl(tmp_path / "held.jsonl", _pairs("hindi", 6, 14) + _pairs("marathi", 0, 12))
    cfg = DataConfig(target=SourceConfig(kind="jsonl", path=str(target)),
                     candidates=[SourceConfig(kind="jsonl", path=str(pool), group_by="g")], preview_size=3,
                     eval={"greetings": SourceConfig(**GREETINGS), "held": SourceConfig(kind="jsonl", path=str(held))})
    data = prepare(cfg, tok, 128)
    sets = evaluation_sets(data, cfg)
    assert [e.name for e in sets] == ["target_val", "greetings", "held"]
    assert sets[0].tokens == tuple(data.target_val) and len(sets[0].examples) == 4  # 30 % of 12
    assert len(sets[1].examples) == 25 and "marathi/greetings" in sets[1].source
    assert len(sets[2].examples) == 8 + 4  # the 8 Hindi pairs and the target's validation pairs, not its training
    assert sum("evaluation 'held': 8 of its 20" in w for w in data.warnings) == 1
    assert [e["name"] for e in data.summary_fields()["evaluations"]] == ["target_val", "greetings", "held"]
    cut = dataclasses.replace(cfg, eval_size=5)
    once, again = (evaluation_sets(prepare(cut, tok, 128), cut) for _ in range(2))
    assert len(once[1].examples) == 5 and once[1].examples == again[1].examples
    assert set(once[1].examples) < set(sets[1].examples)
    only_train = write_jsonl(tmp_path / "copy.jsonl", _pairs("marathi", 0, 12))
    copy = dataclasses.replace(cfg, eval={"copy": SourceConfig(kind="jsonl", path=str(only_train))})
    assert len(evaluation_sets(prepare(copy, tok, 128), copy)[1].examples) == 4  # the validation pairs alone
    train_only = write_jsonl(tmp_path / "train.jsonl", [
        {"prompt": e.messages[0][1], "response": e.messages[1][1]} for e in _train_examples(data)])
    with pytest.raises(DataError, match="data.eval.train .*every one of its 8 examples equals a target training"):
        prepare(dataclasses.replace(cfg, eval={"train": SourceConfig(kind="jsonl", path=str(train_only))}), tok, 128)


def _train_examples(data) -> list:
    """The raw examples of the target's training split (the target minus its validation split)."""
    return split_target(data.target, 0.3, 0)[0]


def test_a_job_measures_every_evaluation_and_the_base_model(tiny_model_dir, tmp_path):
    """One fine-tune job (no Ray): its record holds every evaluation's loss, target_val's equal to val_loss, and
    theta_0's on each where it measured the base; the base task alone gives the same base values."""
    from convalue.actors.finetune_job import run_base_eval, run_finetune_job
    from convalue.engine.model.loading import load_tokenizer
    from convalue.engine.model.spec import ReplicaSpec

    tok = load_tokenizer(tiny_model_dir)
    target = write_jsonl(tmp_path / "marathi.jsonl", _pairs("marathi", 0, 12))
    pool = write_jsonl(tmp_path / "pool.jsonl", [r | {"group": "hindi"} for r in _pairs("hindi", 0, 6)])
    held = write_jsonl(tmp_path / "held.jsonl", _pairs("hindi", 6, 12))
    data = tiny_run_config(tmp_path, tiny_model_dir, target, pool, finetune={"enabled": True, "steps": 2,
                                                                             "batch_size": 2})
    data["data"]["eval"] = {"held": {"kind": "jsonl", "path": str(held)}}
    cfg = config_from_dict(data)
    prepared = prepare(cfg.data, tok, cfg.model.max_length)
    spec = ReplicaSpec.from_config(cfg, tiny_model_dir, tok.pad_token_id)
    hindi = [t for t in prepared.items[0].examples]
    result = run_finetune_job(spec, "target + hindi", prepared.target_train, {"hindi": hindi}, prepared.target_val,
                              True, evals=prepared.evals)
    assert set(result.evaluations) == {"target_val", "held"}
    assert result.evaluations["target_val"].loss == result.val_loss
    assert result.base_evaluations["target_val"].loss == result.base_val_loss
    assert result.evaluations["held"].loss != result.base_evaluations["held"].loss  # the adapter moved
    record = json.loads(json.dumps(result.to_dict()))  # as the fine-tune store keeps it
    assert record["evaluations"]["held"]["loss"] == result.evaluations["held"].loss
    base = run_base_eval(spec, prepared.target_val, None, prepared.evals)
    assert base["held"].loss == pytest.approx(result.base_evaluations["held"].loss, rel=1e-6)
    assert base["target_val"].loss == pytest.approx(result.base_val_loss, rel=1e-6)


def test_a_run_with_two_evaluations_reports_each_and_selects_by_the_named_one(ray_session, tiny_model_dir, tmp_path):
    """End to end: a config with two data.eval sources and a candidate that copies the target; every fine-tune is
    measured on all three evaluations, best k, Borda and the verdict follow select_by, the tables and plot name
    their evaluation, the copy is dropped and recorded; choosing another select_by retrains nothing."""
    from convalue.engine.driver.pipeline import run

    marathi = _pairs("marathi", 0, 12)
    target = write_jsonl(tmp_path / "marathi.jsonl", marathi)
    rows = [r | {"group": lang} for lang in ("english", "hindi", "german") for r in _pairs(lang, 0, 6)]
    pool = write_jsonl(tmp_path / "pool.jsonl", rows + [r | {"group": "copy"} for r in marathi])
    held = write_jsonl(tmp_path / "held.jsonl", _pairs("hindi", 6, 14))
    # one fine-tune in flight: they run one after another in one task process, which imports torch once
    data = tiny_run_config(tmp_path, tiny_model_dir, target, pool,
                           finetune={"enabled": True, "steps": 2, "batch_size": 2, "ks": [1, 2], "repeats": 2,
                                     "baselines": ["target_only", "alignment"], "select_by": "greetings:loss",
                                     "eval_every": 1},
                           ray={"max_in_flight": 1})
    data["data"] |= {"eval": {"greetings": GREETINGS, "held": {"kind": "jsonl", "path": str(held)}}, "eval_size": 8}
    summary = run(config_from_dict(data))
    run_dir = tmp_path / "runs" / "t"
    assert summary.data["leakage"]["removed"] == ["copy"] and "copy" not in summary.order
    assert [e["name"] for e in summary.data["evaluations"]] == ["target_val", "greetings", "held"]
    ev = summary.evaluation
    assert ev["select_by"] == "greetings:loss" and ev["evaluation"] == "greetings"
    for r in summary.finetune:
        assert set(r["evaluations"]) == {"target_val", "greetings", "held"}
        assert r["evaluations"]["target_val"]["loss"] == r["val_loss"]
    on = {(e["evaluation"], e["metric"]): e for e in ev["evaluations"]}
    assert set(on) == {("target_val", "loss"), ("greetings", "loss"), ("held", "loss")}
    greetings = summarise_measure(summary.finetune, [1, 2], Measure("greetings", "loss"))
    assert ev["borda"] == greetings.borda and ev["best_k"]["kmm"]["k"] == greetings.best_k["kmm"].k
    assert on["held", "loss"]["best_k"]["kmm"]["k"] == summarise_measure(
        summary.finetune, [1, 2], Measure("held", "loss")).best_k["kmm"].k
    assert ev["verdict"]["evaluation"] == "greetings" and ev["verdict"]["k"] == greetings.best_k["kmm"].k
    assert ev["verdict"]["kind"] in ("buy", "no resolvable difference", "do not buy")
    table = pq.read_table(run_dir / "evaluation.parquet")
    assert {e["evaluation"] for e in table.column("evaluations").to_pylist()[0]} == {"target_val", "greetings", "held"}
    text = format_evaluation(summary.finetune, ev)
    assert text.index("loss on evaluation 'greetings'") < text.index("target validation loss (target_val)") < \
        text.index("loss on evaluation 'held'")
    html = (run_dir / "report.html").read_text(encoding="utf-8")
    assert "Verdict: " + ev["verdict"]["kind"] in html and "Leakage check: </strong>12 of the" in html
    assert 'id="evaluation-table-held-loss"' in html and "In short: " in html
    # finetune.eval_every 1: every fine-tune's curve at steps 1 and 2 on all three evaluations, each cell's mean
    assert all([p["step"] for p in r["curve"]] == [1, 2] and set(r["curve"][0]["losses"]) == set(r["evaluations"])
               for r in summary.finetune)
    kmm = next(c for c in ev["curves"] if c["method"] == "kmm" and c["k"] == 1 and c["evaluation"] == "greetings")
    ends = [r["evaluations"]["greetings"]["loss"] for r in summary.finetune if r["method"] == "kmm" and r["k"] == 1]
    assert kmm["steps"] == [1, 2] and kmm["seeds"] == 2 and kmm["mean"][-1] == pytest.approx(sum(ends) / len(ends))
    assert {c["evaluation"] for c in ev["curves"]} == {"target_val", "greetings", "held"}
    assert len(table.column("curve").to_pylist()[0]) == 2 * 3  # two steps x three evaluations
    assert "learning curves: loss on greetings" in text and "Learning curves (finetune.eval_every)" in html
    assert (run_dir / "curves.png").read_bytes().startswith(b"\x89PNG")
    again = run(config_from_dict(data | {"finetune": data["finetune"] | {"select_by": "held:loss"}}))
    assert again.evaluation["fine_tunes"]["trained"] == 0  # select_by chooses among the measures: nothing retrains
    assert again.evaluation["verdict"]["evaluation"] == "held"
    assert evaluation_table(again.finetune).num_rows == len(summary.finetune)
