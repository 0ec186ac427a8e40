"""No leakage: a candidate example equal to a target training, target validation or evaluation example (casefolded,
NFKC, whitespace collapsed, prompt and response together) is dropped before any scoring, with one warning per
group; a group left with nothing is dropped; the run records what went."""

from __future__ import annotations

import pytest
from conftest import write_jsonl

from convalue.engine.config import DataConfig, SourceConfig
from convalue.engine.data.examples import DataError, Example, Group
from convalue.engine.data.leakage import ProtectedSet, drop_leaks, example_key, normalise_text
from convalue.engine.data.prepare import prepare
from convalue.engine.data.sources import load_source, split_target


def _ex(prompt: str, response: str) -> Example:
    return Example((("user", prompt), ("assistant", response)))


def test_text_is_compared_casefolded_nfkc_and_whitespace_collapsed():
    assert normalise_text("  Ｈｅｌｌｏ\u00a0\tWORLD\n ") == "hello world"  # full-width and no-break space: NFKC
    assert normalise_text("Straße") == normalise_text("STRASSE")  # casefold, not lower
    assert example_key(_ex("Hi  there", "Hello!")) == example_key(_ex("hi there", "HELLO!"))
    # prompt and response together: the same texts in other roles, or another response, are other examples
    assert example_key(_ex("a", "b")) != example_key(_ex("b", "a"))
    assert example_key(_ex("a", "b")) != example_key(_ex("a", "c"))


def test_a_copy_of_the_target_is_dropped_and_a_partial_overlap_loses_its_shared_examples():
    target = [_ex(f"question {i}", f"answer {i}") for i in range(10)]
    train, val = target[:7], target[7:]
    evaluation = [_ex("held out", "elsewhere")]
    copy = Group("copy", [_ex(e.messages[0][1].upper(), e.messages[1][1] + "  ") for e in target], "copy.jsonl")
    others = [_ex(f"other {i}", f"reply {i}") for i in range(5)]
    partial = Group("partial", [*others[:3], target[0], val[0], evaluation[0], others[3]], "pool.jsonl",
                    members=[("src", i) for i in range(7)])
    clean = Group("clean", others, "pool.jsonl")
    kept, report = drop_leaks([copy, partial, clean], [ProtectedSet("target_train", train),
                                                       ProtectedSet("target_val", val),
                                                       ProtectedSet("heldout", evaluation)])
    assert [g.name for g in kept] == ["partial", "clean"]
    assert kept[1] is clean  # untouched: the same object, so its preview (and stored vector) stay as they were
    assert kept[0].examples == [*others[:3], others[3]]
    assert kept[0].members == [("src", 0), ("src", 1), ("src", 2), ("src", 6)]  # a cluster's members follow
    by = {g.group: g for g in report.groups}
    assert by["copy"].removed and by["copy"].matched == {"target_train": 7, "target_val": 3}
    assert by["partial"].dropped == 3 and not by["partial"].removed
    assert by["partial"].matched == {"target_train": 1, "target_val": 1, "heldout": 1}
    assert report.dropped == 13 and report.checked == 10 + 7 + 5 and report.removed == ["copy"]
    assert "every one of its 10 example(s)" in by["copy"].warning() and "group is dropped" in by["copy"].warning()
    assert "3 of its 7 example(s)" in by["partial"].warning() and "of evaluation 'heldout'" in by["partial"].warning()
    record = report.to_dict()
    assert record["dropped"] == 13 and record["removed"] == ["copy"] and record["against"] == [
        "target_train", "target_val", "heldout"]
    assert "13 of the 22 candidate examples" in report.line()
    none, clean_report = drop_leaks([clean], [ProtectedSet("target_train", train)])
    assert none == [clean] and clean_report.groups == () and "none of the 5" in clean_report.line()


def _pairs(group: Group, n: int) -> list[dict]:
    return [{"prompt": e.messages[0][1], "response": e.messages[1][1]} for e in group.examples[:n]]


def _config(tmp_path, target_rows, pool_rows, **kw) -> DataConfig:
    t = write_jsonl(tmp_path / "target.jsonl", target_rows)
    p = write_jsonl(tmp_path / "pool.jsonl", pool_rows)
    return DataConfig(target=SourceConfig(kind="jsonl", path=str(t)),
                      candidates=[SourceConfig(kind="jsonl", path=str(p), group_by="g")], preview_size=3,
                      small_groups="keep", **kw)


def test_prepare_drops_a_copied_target_before_any_preview_and_records_it(tmp_path, smollm2_dir):
    """A candidate file identical to the target (its validation split included) loses every example and leaves the
    pool with a warning; one that shares a few examples loses exactly those; the others keep their previews."""
    from convalue.engine.model.loading import load_tokenizer

    tok = load_tokenizer(smollm2_dir)
    corpus = load_source(SourceConfig(kind="chatterbot", include=["marathi", "english", "hindi"]))  # parsed once
    target, english, hindi = (_pairs(corpus[lang], n) for lang, n in (("marathi", 12), ("english", 6), ("hindi", 6)))
    # the split prepare makes (seeded by the target group's name, the file's stem)
    train, val = split_target(Group("target", [_ex(r["prompt"], r["response"]) for r in target], "t"), 0.3, 0)
    val_row = {"prompt": val[0].messages[0][1], "response": val[0].messages[1][1]}
    pool = ([r | {"g": "copy"} for r in target] + [r | {"g": "english"} for r in english]
            + [r | {"g": "partial"} for r in hindi[:4]] + [target[0] | {"g": "partial"}, val_row | {"g": "partial"}])
    clean = prepare(_config(tmp_path, target, [r for r in pool if r["g"] == "english"]), tok, 128)
    data = prepare(_config(tmp_path, target, pool), tok, 128)
    assert data.names() == ["english", "partial"]
    partial = next(g for g in data.candidates if g.name == "partial")
    assert len(partial.examples) == 4  # the two shared pairs are gone, the four Hindi ones stay
    assert data.items[0] == clean.items[0]  # a group that shares nothing has the preview it had without the others
    leak = data.summary_fields()["leakage"]
    assert leak["removed"] == ["copy"] and leak["dropped"] == 12 + 2
    assert {g["group"]: g["matched"] for g in leak["groups"]} == {
        "copy": {"target_train": 8, "target_val": 4}, "partial": {"target_train": 1, "target_val": 1}}
    assert sum("'copy'" in w for w in data.warnings) == 1 and sum("'partial'" in w for w in data.warnings) == 1
    with pytest.raises(DataError, match="no candidate group is left to value \\(the leakage check dropped 1 whole\\)"):
        prepare(_config(tmp_path, target, [r for r in pool if r["g"] == "copy"]), tok, 128)
