"""`convalue status` on summaries written by hand: what it reads and prints without vectors or Ray."""

from __future__ import annotations

import json

from convalue.engine.store.status import format_status, run_status


def test_a_finished_summary_is_reported_with_its_best_k_and_progress(tmp_path):
    summary = {"status": "complete", "data": {"candidates": 4}, "selected": ["hindi", "urdu"],
               "timings_s": {"featurize": 12.5, "finetune": 30.0},
               "progress": {"featurize": {"done": 5, "total": 5, "seconds": 12.5}, "gram": {"done": 0, "total": None}},
               "evaluation": {"best_k": {"kmm": {"k": 2, "val_loss": 2.5, "val_loss_sd": 0.01},
                                         "random": {"k": 1, "val_loss": 2.7, "val_loss_sd": None}}},
               "finetune_stale": "KMM buys other groups at k in [2]"}
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    (tmp_path / "finetunes").mkdir()
    (tmp_path / "finetunes" / "a.json").write_text(json.dumps({"val_loss": 2.5}))
    (tmp_path / "finetunes" / "b.json").write_text(json.dumps({"base_val_loss": 3.1}))  # the base model: not one
    (tmp_path / "finetunes" / "c.json").write_text("{damaged")
    status = run_status(tmp_path)
    assert status["state"] == "complete" and status["vectors"] is None and status["finetune_records"] == 1
    text = format_status(status)
    assert text.splitlines()[0] == f"{tmp_path}: complete"
    assert "fine-tune records in finetunes/: 1" in text and "featurize: 5 of 5 in 12.5 s" in text
    assert "gram" not in text.split("timings")[0]  # a stage without items is not listed as progress
    assert "best k of kmm: 2 (validation loss 2.5000 ± 0.0100)" in text
    assert "best k of random: 1 (validation loss 2.7000)" in text
    assert "selected: hindi, urdu" in text and "note: KMM buys other groups" in text


def test_an_interrupted_re_solve_says_to_solve_again(tmp_path):
    (tmp_path / "summary.json").write_text(json.dumps({"status": "resolving", "resolving": {"status": "complete"}}))
    status = run_status(tmp_path)
    assert status["state"] == "interrupted" and status["command"] == "solve"
    assert "run `convalue solve` on it again" in format_status(status)
