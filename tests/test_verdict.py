"""The run's one verdict: each kind pinned to the paired intervals that produce it, computed once into summary.json
and repeated by the CLI line, `convalue status`'s verdict_line and report.html's opening line."""

from __future__ import annotations

import pytest

from convalue.engine.files.folder import as_folder
from convalue.engine.protocol.measures import Measure
from convalue.engine.protocol.summaries import summarise, summarise_measure
from convalue.engine.protocol.verdict import (
    BUY,
    DO_NOT_BUY,
    NO_DIFFERENCE,
    NOT_EVALUATED,
    Verdict,
    classify,
    judge,
    not_evaluated,
    verdict_from_evaluation,
    verdict_line,
    verdict_of,
)
from convalue.engine.report.html_sections import answer_text
from convalue.engine.report.run_files import RunFiles
from convalue.engine.report.tables import format_verdict
from convalue.engine.store.summary import RunSummary


@pytest.mark.parametrize("interval, kind", [
    ((0.002, 0.02), BUY),  # the selection's advantage lies above 0
    ((1e-12, 1e-9), BUY),
    ((-0.02, -0.002), DO_NOT_BUY),  # below 0: the target alone is better
    ((-0.01, 0.01), NO_DIFFERENCE),  # holds 0
    ((0.0, 0.01), NO_DIFFERENCE),  # touching 0 is not beyond noise
    ((-0.01, 0.0), NO_DIFFERENCE),
    ((0.0, 0.0), NO_DIFFERENCE),  # a selection that buys nothing is the target alone
    (None, NO_DIFFERENCE),  # one seed: no interval, nothing resolved
])
def test_each_interval_of_the_advantage_gives_its_verdict(interval, kind):
    assert classify(interval) == kind


@pytest.mark.parametrize("metric, mean, ci, kind, advantage", [
    # loss: KMM minus target alone; negative is the selection lower, so better
    ("loss", -0.0120, (-0.0190, -0.0050), BUY, 0.0120),
    ("loss", +0.0122, (+0.0022, +0.0223), DO_NOT_BUY, -0.0122),
    ("loss", +0.0140, (-0.0114, +0.0393), NO_DIFFERENCE, -0.0140),
    # accuracy: higher is better, so KMM minus target alone is the advantage itself
    ("accuracy", +0.10, (+0.02, +0.18), BUY, 0.10),
    ("accuracy", -0.10, (-0.18, -0.02), DO_NOT_BUY, -0.10),
    ("accuracy", +0.05, (-0.03, +0.13), NO_DIFFERENCE, 0.05),
])
def test_the_verdict_reads_kmm_minus_target_alone_in_the_metrics_direction(metric, mean, ci, kind, advantage):
    v = judge(Measure("heldout", metric), 3, ["hindi", "urdu"], mean, ci, 3)
    assert v.kind == kind and v.difference == pytest.approx(advantage)
    assert v.interval[0] < v.interval[1] and (v.interval[0] > 0) == (kind == BUY)
    assert v.evaluation == "heldout" and v.metric == metric and v.k == 3 and v.groups == ("hindi", "urdu")
    assert "on heldout" in v.sentence and "best k = 3 (hindi, urdu)" in v.sentence and "3 seed(s)" in v.sentence
    assert Verdict.from_dict(v.to_dict()) == v
    assert v.line() == f"verdict: {kind} — {v.sentence}"


def test_one_seed_resolves_nothing_and_says_how_to():
    v = judge(Measure(), 1, ["hindi"], -0.5, None, 1)
    assert v.kind == NO_DIFFERENCE and v.interval is None and "one seed gives no interval" in v.sentence


def _rows(kmm: list[float], alone: list[float], heldout_kmm: list[float], heldout_alone: list[float]) -> list[dict]:
    """KMM at k = 1 and 2 (k = 2 worse by 0.05 everywhere) and the target alone, one row per seed, with the losses
    on the target's validation split and on `heldout`."""
    base = {"steps": 24, "label": "", "target_steps": 12, "aux_steps": 12}
    rows = []
    for k, shift in ((1, 0.0), (2, 0.05)):
        rows += [base | {"method": "kmm", "k": k, "seed": s, "groups": ["a", "b"][:k], "val_loss": v + shift,
                         "evaluations": {"target_val": {"loss": v + shift}, "heldout": {"loss": h + shift}}}
                 for s, (v, h) in enumerate(zip(kmm, heldout_kmm))]
    rows += [base | {"method": "target_only", "k": None, "seed": s, "groups": [], "val_loss": v,
                     "evaluations": {"target_val": {"loss": v}, "heldout": {"loss": h}}}
             for s, (v, h) in enumerate(zip(alone, heldout_alone))]
    return rows


def test_the_verdict_is_computed_on_the_select_by_evaluation_at_kmms_best_k():
    """The target alone wins on its own validation split, the selection on a distinct evaluation: each select_by
    gives its own verdict, and the summary stores the one of the select_by measure."""
    rows = _rows([2.95, 2.96, 2.94], [2.90, 2.92, 2.91], [3.10, 3.12, 3.11], [3.20, 3.21, 3.22])
    on_val = verdict_of(summarise_measure(rows, [1, 2], Measure()))
    on_heldout = verdict_of(summarise_measure(rows, [1, 2], Measure("heldout", "loss")))
    assert on_val.kind == DO_NOT_BUY and on_val.evaluation == "target_val" and on_val.k == 1
    assert on_heldout.kind == BUY and on_heldout.evaluation == "heldout" and on_heldout.groups == ("a",)
    assert on_heldout.difference == pytest.approx(0.10)
    ev = summarise([dict(r) for r in rows], [1, 2], "heldout:loss")
    assert ev["select_by"] == "heldout:loss" and ev["best_k"]["kmm"]["value"] == pytest.approx(3.11)
    assert verdict_from_evaluation(ev) == on_heldout  # a summary without a stored verdict: the same one
    ev["verdict"] = on_heldout.to_dict()
    assert verdict_from_evaluation(ev) == on_heldout and verdict_line(ev) == on_heldout.line()


def test_without_a_comparison_the_ranking_stands_alone():
    rows = [r for r in _rows([2.9] * 2, [2.9] * 2, [3.0] * 2, [3.0] * 2) if r["method"] != "target_only"]
    no_alone = verdict_of(summarise_measure(rows, [1, 2]))
    assert no_alone.kind == NOT_EVALUATED and "add target_only to finetune.baselines" in no_alone.sentence
    for ev in (None, {}, {"verdict": not_evaluated().to_dict()}):
        assert verdict_from_evaluation(ev).kind == NOT_EVALUATED
        assert verdict_line(ev).startswith("verdict: not evaluated — no fine-tune ran")
    assert "faithfulness" in verdict_line({"faithfulness": {"table": []}})  # an analysis folder, not a run's
    assert format_verdict([], None, 35) == not_evaluated().line()


@pytest.mark.parametrize("heldout_kmm, kind, opening", [
    ([3.10, 3.12, 3.11], BUY, "Train on a together with marathi's own data: on heldout"),
    ([3.30, 3.31, 3.32], DO_NOT_BUY, "Train on marathi's own data alone: on heldout, the target alone beats"),
    ([3.18, 3.25, 3.20], NO_DIFFERENCE, "No resolvable difference: on heldout"),
])
def test_the_reports_opening_line_follows_the_verdict(tmp_path, heldout_kmm, kind, opening):
    """report.html's "In short" recommends buying only when the verdict is `buy`; the run's own printed regime
    line ends with the same verdict."""
    rows = _rows([2.95, 2.96, 2.94], [2.90, 2.92, 2.91], heldout_kmm, [3.20, 3.21, 3.22])
    ev = summarise(rows, [1, 2], "heldout:loss")
    ev["verdict"] = verdict_of(summarise_measure(rows, [1, 2], Measure("heldout", "loss"))).to_dict()
    assert ev["verdict"]["kind"] == kind
    summary = RunSummary(status="complete", selected=["a", "b"], data={"target": "marathi"}, evaluation=ev,
                         finetune=rows)
    text = answer_text(RunFiles(as_folder(tmp_path), summary))
    assert text.startswith(opening)
    assert ("together with" in text) == (kind == BUY)
    assert format_verdict(rows, ev, 73).splitlines()[-1] == f"verdict: {kind} — {ev['verdict']['sentence']}"
    disabled = RunSummary(status="complete", selected=["a", "b"], data={"target": "marathi"},
                          evaluation={"verdict": not_evaluated().to_dict()})
    assert answer_text(RunFiles(as_folder(tmp_path), disabled)).startswith(
        "KMM would buy a, b for marathi. Not evaluated: no fine-tune ran")
