"""`convalue status` on summaries written by hand: what it reads and prints without vectors or Ray."""

from __future__ import annotations

import json

from convalue.engine.report.status_text import best_k_measure, format_status
from convalue.engine.store.status import run_status


def test_a_failed_summary_is_reported_with_its_stage_progress_and_records(tmp_path):
    summary = {"status": "failed", "data": {"candidates": 4}, "failed_stage": "finetune",
               "error": "RuntimeError: no memory", "timings_s": {"featurize": 12.5, "finetune": 30.0},
               "progress": {"featurize": {"done": 5, "total": 5, "seconds": 12.5},
                            "finetune": {"done": 2, "total": 6, "seconds": 30.0}, "gram": {"done": 0, "total": None}},
               "finetune_stale": "KMM buys other groups at k in [2]"}
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    (tmp_path / "finetunes").mkdir()
    (tmp_path / "finetunes" / "a.json").write_text(json.dumps({"val_loss": 2.5}))
    (tmp_path / "finetunes" / "b.json").write_text(json.dumps({"base_val_loss": 3.1}))  # the base model: not one
    (tmp_path / "finetunes" / "c.json").write_text("{damaged")
    status = run_status(tmp_path)
    assert status.state == "failed" and status.exit_code == 1 and status.vectors is None
    assert status.finetune_records == 1
    text = format_status(status)
    assert text.splitlines()[0] == f"{tmp_path}: failed"
    assert "failed in stage finetune: RuntimeError: no memory" in text
    assert "fine-tune records in finetunes/: 1" in text and "finetune: 2 of 6 in 30.0 s" in text
    assert "gram" not in text.split("timings")[0]  # a stage without items is not listed as progress
    assert "note: KMM buys other groups" in text


def test_a_run_stopped_by_a_signal_is_interrupted_not_failed(tmp_path):
    summary = {"status": "failed", "failed_stage": "featurize", "signal": "SIGINT", "error": "Interrupted: SIGINT"}
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    status = run_status(tmp_path)
    assert status.state == "interrupted" and status.exit_code == 1
    assert "interrupted (stopped by SIGINT; run the same command again to resume" in format_status(status)


def test_a_complete_summary_that_promises_nothing_is_damaged(tmp_path):
    (tmp_path / "summary.json").write_text(json.dumps({"status": "complete"}))
    status = run_status(tmp_path)
    assert status.state == "damaged" and status.exit_code == 1
    assert "lacks `config`, `order`, `solver`, `selected`, `artifacts`" in status.problems[0]
    assert "DAMAGED (2)" in format_status(status)  # the summary, and the vectors it records, missing
    (tmp_path / "summary.json").write_text("{")
    status = run_status(tmp_path)
    assert status.state == "damaged" and "not readable JSON" in status.problems[0]


def test_best_k_is_shown_on_the_evaluation_that_chose_it():
    """status and list name the measure select_by used (a named evaluation), not the target's validation loss."""
    named = {"k": 1, "val_loss": 3.4536, "val_loss_sd": 0.011, "evaluation": "greetings", "metric": "loss",
             "value": 2.8843, "value_sd": 0.0188}
    assert best_k_measure(named) == "greetings loss 2.8843 ± 0.0188"
    assert best_k_measure({"k": 3, "val_loss": 2.9084}) == "validation loss 2.9084"  # no evaluation named
