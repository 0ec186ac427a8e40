"""finetune.tune: Alg. 1's rho_k chosen per budget from a grid on an evaluation that is not the reported one; the
choice rule, the config's refusals, and a real run that tunes, reuses its tuning fine-tunes and reports the choice."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import chatterbot_pairs, tiny_run_config, write_jsonl

from convalue.engine.config import ConfigError, config_from_dict
from convalue.engine.protocol.measures import Measure
from convalue.engine.protocol.tuning import choose_rho
from convalue.engine.report.tables import format_evaluation, tuning_table

pytestmark = pytest.mark.heavy  # one whole run: scheduled before the light modules (conftest.py)

GREETINGS = {"kind": "chatterbot", "group_by": "language/topic", "include": ["marathi/greetings"]}


def _row(method: str, k: int, rho: float, seed: int, loss: float, accuracy: float | None = None,
         groups: tuple[str, ...] = ("a",)) -> dict:
    return {"method": method, "k": k, "rho": rho, "seed": seed, "groups": list(groups), "val_loss": loss,
            "val_accuracy": accuracy}


@pytest.mark.parametrize(("losses", "measure", "chosen"), [
    # {rho: (method kmm's loss, method random's loss)}: the best mean over the methods wins, not the best cell
    ({0.25: (1.0, 3.0), 0.75: (1.5, 2.0)}, "loss", 0.75),
    ({0.25: (1.0, 2.0), 0.75: (1.5, 2.0)}, "loss", 0.25),
    ({0.25: (1.5, 2.0), 0.75: (2.0, 1.5)}, "loss", 0.25),  # a tie: the grid's first
    ({0.25: (0.2, 0.3), 0.75: (0.4, 0.3)}, "accuracy", 0.75),  # accuracy: higher is better
])
def test_rho_k_is_the_grid_ratio_with_the_best_mean_over_methods(losses, measure, chosen):
    rows = []
    for rho, (kmm, rnd) in losses.items():
        for m, v in (("kmm", kmm), ("random", rnd)):
            rows.append(_row(m, 3, rho, 0, v if measure == "loss" else 9.0, v if measure == "accuracy" else None))
    t = choose_rho(rows, [3], Measure("target_val", measure), [0.25, 0.75], [0])
    assert t.chosen == {3: chosen} and t.cells == {3: 2}
    assert t.values[3] == pytest.approx(tuple(sum(v) / 2 for v in losses.values()))
    assert t.rho_at(3) == chosen and t.to_dict()["chosen"] == {"3": chosen}


def test_a_budget_where_nothing_is_bought_has_no_rho_k_and_unequal_cells_are_refused():
    rows = [_row("kmm", 1, r, 0, 1.0) for r in (0.25, 0.75)]
    t = choose_rho(rows, [1, 2], Measure(), [0.25, 0.75], [0])
    assert t.chosen == {1: 0.25} and t.values[2] == (None, None) and t.rho_at(2) is None
    with pytest.raises(ValueError, match="different numbers of fine-tunes"):
        choose_rho(rows[:1] + [_row("random", 1, 0.25, 0, 2.0), rows[1]], [1], Measure(), [0.25, 0.75], [0])
    with pytest.raises(ValueError, match="no finite loss on target_val"):
        choose_rho([_row("kmm", 1, 0.25, 0, float("nan")), rows[1]], [1], Measure(), [0.25, 0.75], [0])


def test_the_tuning_seeds_follow_the_reported_ones_and_a_bare_metric_is_on_target_val(tmp_path, tiny_model_dir):
    data = _config(tmp_path, tiny_model_dir)
    assert config_from_dict(data).finetune.tuning_seeds() == []
    data["finetune"] |= {"seed": 5, "tune": {"rho": [0.25, 0.75], "by": "loss", "repeats": 2}}
    ft = config_from_dict(data).finetune
    assert ft.seeds() == [5, 6] and ft.tuning_seeds() == [7, 8] and ft.tune.measure_parts() == ("target_val", "loss")


def test_a_damaged_tuning_record_is_left_out_of_the_tables():
    for damaged in ({"grid": [0.25], "values": [1.0], "chosen": {}}, {"grid": 3}, "tuned",
                    {"grid": [0.25, 0.75], "values": {"1": "x"}, "chosen": {}}):
        out = tuning_table({"tuning": damaged})
        assert out is None or out[2] == []
    about, head, body = tuning_table({"tuning": {"grid": [0.25, 0.75], "values": {"1": [1.0, "x"], "2": [None, None]},
                                                 "chosen": {"1": 0.25}, "by": "target_val:loss"}})
    assert head == ["budget", "rho = 0.25", "rho = 0.75", "chosen"]
    assert body == [["k = 1", "1.0000 *", "-", "rho_k = 0.25"], ["k = 2", "-", "-", "none bought (target alone)"]]


@pytest.mark.parametrize(("tune", "over", "field", "words"), [
    ({"rho": [0.5]}, {}, "finetune.tune.rho", "at least two distinct"),
    ({"rho": [0.25, 0.25]}, {}, "finetune.tune.rho", "at least two distinct"),
    ({"rho": [0.25, 1.25]}, {}, "finetune.tune.rho.1", r"in \[0, 1\]"),
    ({"rho": [0.25, 0.75], "by": "greetings:loss"}, {}, "finetune.tune.by", "would flatter it"),
    ({"rho": [0.25, 0.75], "by": "nope:loss"}, {}, "finetune.tune.by", "neither `target_val`"),
    ({"rho": [0.25, 0.75], "by": "target_val:accuracy"}, {}, "finetune.tune.by", "a metric of finetune.metrics"),
    ({"rho": [0.25, 0.75], "repeats": 0}, {}, "finetune.tune.repeats", ">= 1"),
    ({"rho": [0.25, 0.75]}, {"strategy": "deepspeed"}, "finetune.tune.rho", "tune with strategy `task`"),
    ({"rho": [0.25, 0.75]}, {"rho_by_k": {1: 0.3}}, "finetune.tune.rho", "rho_by_k both"),
    ({"rho": [0.0, 0.75]}, {"budget": "additive"}, "finetune.tune.rho", "with budget `additive`"),
])
def test_a_tuning_section_that_cannot_hold_is_refused_by_name(tmp_path, tiny_model_dir, tune, over, field, words):
    data = _config(tmp_path, tiny_model_dir)
    data["finetune"] |= {"tune": tune} | over
    with pytest.raises(ConfigError, match=words) as err:
        config_from_dict(data)
    assert err.value.field == field


def _config(tmp_path, model_dir) -> dict:
    """A Marathi target of 12 pairs, three languages of 6 as candidates, Marathi greetings as the reported
    evaluation; KMM and the target alone at k = 1, 2 over two seeds."""
    target = write_jsonl(tmp_path / "marathi.jsonl", chatterbot_pairs("marathi", 12))
    rows = [r | {"group": lang} for lang in ("english", "hindi", "german") for r in chatterbot_pairs(lang, 6)]
    pool = write_jsonl(tmp_path / "pool.jsonl", rows)
    data = tiny_run_config(tmp_path, model_dir, target, pool,
                           finetune={"enabled": True, "steps": 2, "batch_size": 2, "ks": [1, 2], "repeats": 2,
                                     "baselines": ["target_only"], "select_by": "greetings:loss"},
                           ray={"max_in_flight": 1})
    data["data"] |= {"eval": {"greetings": GREETINGS}, "eval_size": 8}
    return data


def test_a_run_tunes_rho_k_on_target_val_and_reports_on_its_evaluation(ray_session, tiny_model_dir, tmp_path):
    """End to end: KMM and random fine-tuned at each k under each grid ratio with a tuning seed after the reported
    ones; rho_k is the ratio with the lower mean target_val loss; every reported run at k trains with it, none is a
    tuning fine-tune; summary, printed tables and report.html carry the choice; a rerun trains nothing, and neither
    does an untuned run that sets the same rho_k by hand (the fine-tunes are keyed by their ratio alone)."""
    from convalue.engine.driver.pipeline import run

    data = _config(tmp_path, tiny_model_dir)
    data["finetune"] |= {"baselines": ["target_only", "random"], "tune": {"rho": [0.25, 0.75], "by": "target_val:loss"}}
    summary = run(config_from_dict(data))
    assert summary.status == "complete"
    t = summary.evaluation["tuning"]
    assert t["by"] == "target_val:loss" and t["grid"] == [0.25, 0.75] and t["seeds"] == [2]
    rows, run_dir = summary.finetune, tmp_path / "runs" / "t"
    for k in (1, 2):
        chosen, values = t["chosen"][str(k)], t["values"][str(k)]
        assert t["cells"][str(k)] == 2  # KMM and random buy at k, one tuning seed
        assert chosen == [0.25, 0.75][values.index(min(values))]
        at_k = [r for r in rows if r["k"] == k]
        assert {r["rho"] for r in at_k} == {chosen} and {r["seed"] for r in at_k} == {0, 1}
    assert not any(r["reused"] for r in rows)  # no reported fine-tune is one that chose rho_k
    assert next(r for r in rows if r["method"] == "target_only")["rho"] == 1.0
    tuned = t["fine_tunes"]["trained"]
    assert 0 < tuned <= 8 and t["fine_tunes"]["reused"] == 0
    on_disk = json.loads((run_dir / "summary.json").read_text())
    assert on_disk["progress"]["tune"]["done"] == on_disk["progress"]["tune"]["total"] == tuned
    assert on_disk["progress"]["tune"]["seconds"] > 0  # its own time, shown in the report's cost table
    assert on_disk["evaluation"]["tuning"] == t
    text = format_evaluation(rows, summary.evaluation)
    assert "rho_k tuned on target_val:loss" in text and f"rho_k = {t['chosen']['1']}" in text
    html = (run_dir / "report.html").read_text(encoding="utf-8")
    assert 'id="tuning-table"' in html
    stored = len(list((run_dir / "finetunes").iterdir()))
    again = run(config_from_dict(data))
    assert again.evaluation["fine_tunes"]["trained"] == 0 and again.evaluation["tuning"]["fine_tunes"] == {
        "trained": 0, "reused": tuned} and len(list((run_dir / "finetunes").iterdir())) == stored
    by_hand = data["finetune"] | {"tune": {}, "rho_by_k": {k: t["chosen"][str(k)] for k in (1, 2)}}
    assert run(config_from_dict(data | {"finetune": by_hand})).evaluation["fine_tunes"]["trained"] == 0
    # bench/main_table.py prints the run's table for docs/paper-results.md, recomputed from the same rows
    bench = [sys.executable, str(Path(__file__).parents[1] / "bench" / "main_table.py")]
    printed = subprocess.run([*bench, str(run_dir)], capture_output=True, text=True, timeout=120)
    assert printed.returncode == 0, printed.stderr
    kmm = next(line for line in printed.stdout.splitlines() if line.startswith("| KMM |"))
    assert kmm.endswith(f" | {summary.evaluation['best_k']['kmm']['k']} | {summary.evaluation['borda']['kmm']:g} |")
    assert "| target only | " in printed.stdout and "| random | " in printed.stdout
    missing = subprocess.run([*bench, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2 and "summary.json" in missing.stderr


def test_a_run_that_fails_after_tuning_keeps_the_chosen_rho_k(ray_session, tiny_model_dir, tmp_path):
    """The reported fine-tunes fail after rho_k was chosen: the failed summary and report.html keep the choice
    (finetune_tuning) beside the tuning's finished fine-tunes, and nothing looks complete."""
    import ray

    from convalue.actors.evaluation import Runners
    from convalue.actors.finetune_job import run_finetune_job
    from convalue.actors.pool import WorkItemError
    from convalue.engine.driver.pipeline import run

    @ray.remote(max_retries=0)
    def fails_on_reported_seeds(spec, label, *rest):
        if spec.finetune.seed == 0:  # the reported seed; the tuning's (1) trains for real
            raise RuntimeError(f"no memory for {label}")
        return run_finetune_job(spec, label, *rest)

    data = _config(tmp_path, tiny_model_dir)
    data["finetune"] |= {"ks": [1], "repeats": 1, "tune": {"rho": [0.25, 0.75], "by": "target_val:loss"}}
    with pytest.raises(WorkItemError, match="no memory for"):
        run(config_from_dict(data), runners=Runners(finetune=fails_on_reported_seeds))
    run_dir = tmp_path / "runs" / "t"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["failed_stage"] == "finetune" and "evaluation" not in summary
    tuning = summary["finetune_tuning"]
    assert tuning["seeds"] == [1] and tuning["grid"] == [0.25, 0.75] and tuning["fine_tunes"]["trained"] == 2
    values = tuning["values"]["1"]
    assert tuning["chosen"] == {"1": [0.25, 0.75][values.index(min(values))]}
    assert {r["seed"] for r in summary["finetune_finished"]} == {1} and len(summary["finetune_finished"]) == 2
    html = (run_dir / "report.html").read_text(encoding="utf-8")
    assert "This run FAILED" in html and "rho_k had been tuned on target_val:loss before the failure" in html

