"""Data sources, groups, previews and their validation (real chatterbot text, small files)."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import chatterbot_pairs, write_jsonl

import convalue
from convalue.engine.config import DataConfig, SourceConfig
from convalue.engine.data.examples import DataError, Example
from convalue.engine.data.prepare import prepare
from convalue.engine.data.sources import load_source, preview_indices, resolve_groups, split_target
from convalue.engine.data.tokenize import IGNORE, tokenize_example


def test_chatterbot_groups_by_language_and_topic():
    by_lang = load_source(SourceConfig(kind="chatterbot", group_by="language"))
    assert len(by_lang) == 28 and len(by_lang["marathi"].examples) == 105
    by_topic = load_source(SourceConfig(kind="chatterbot", group_by="language/topic", include=["english/ai"]))
    assert list(by_topic) == ["english/ai"]


def test_jsonl_parquet_and_folder_sources(tmp_path, caplog):
    rows = [r | {"g": "a" if i % 2 else "b"} for i, r in enumerate(chatterbot_pairs("english", 6))]
    jl = write_jsonl(tmp_path / "pool.jsonl", rows)
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "pool.parquet")
    a = load_source(SourceConfig(kind="jsonl", path=str(jl), group_by="g"))
    b = load_source(SourceConfig(kind="parquet", path=str(tmp_path / "pool.parquet"), group_by="g"))
    assert sorted(a) == sorted(b) == ["a", "b"]
    assert a["a"].examples == b["a"].examples
    folder = tmp_path / "f"
    folder.mkdir()
    write_jsonl(folder / "one.jsonl", rows[:3])
    chat = [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}]
    write_jsonl(folder / "two.jsonl", chat)
    (folder / "three.JSONL").write_text((folder / "one.jsonl").read_text())
    (folder / "notes").mkdir()
    with caplog.at_level("WARNING", logger="convalue"):
        groups = load_source(SourceConfig(kind="folder", path=str(folder)))
    assert sorted(groups) == ["one", "two"]
    assert "files are groups): notes, three.JSONL" in caplog.text  # a suffix is matched as written
    assert groups["two"].examples[0].messages == (("user", "hi"), ("assistant", "hello"))


def test_missing_prompt_field_names_file_line_and_field(tmp_path):
    p = write_jsonl(tmp_path / "bad.jsonl", [{"prompt": "a", "response": "b"}, {"question": "a", "response": "b"}])
    with pytest.raises(DataError, match=r"bad.jsonl:2: missing field\(s\) \['prompt'\]"):
        load_source(SourceConfig(kind="jsonl", path=str(p)))


def test_invalid_json_line(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_text('{"prompt": "a", "response": "b"}\n{oops\n')
    with pytest.raises(DataError, match="bad.jsonl:2: invalid JSON"):
        load_source(SourceConfig(kind="jsonl", path=str(p)))


def test_jsonl_encoding_bom_accepted_and_non_utf8_named(tmp_path):
    rows = chatterbot_pairs("hindi", 3)
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    bom = tmp_path / "bom.jsonl"
    bom.write_bytes(b"\xef\xbb\xbf" + text.encode("utf-8"))
    group = load_source(SourceConfig(kind="jsonl", path=str(bom)))["bom"]
    assert [e.messages[0][1] for e in group.examples] == [r["prompt"] for r in rows]
    latin = tmp_path / "latin.jsonl"
    latin.write_bytes(json.dumps(rows[0]).encode() + b"\n" + '{"prompt": "caf\u00e9", "response": "x"}'.encode("latin-1"))
    with pytest.raises(DataError, match=r"latin.jsonl:2: not UTF-8 text \(byte 0xe9 at column 16\)"):
        load_source(SourceConfig(kind="jsonl", path=str(latin)))


def test_empty_group_is_an_error(tmp_path):
    folder = tmp_path / "f"
    folder.mkdir()
    write_jsonl(folder / "full.jsonl", chatterbot_pairs("english", 2))
    (folder / "empty.jsonl").write_text("")
    with pytest.raises(DataError, match="group 'empty'.*is empty"):
        load_source(SourceConfig(kind="folder", path=str(folder)))


def test_duplicate_group_names_across_sources(tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", [r | {"g": "same"} for r in chatterbot_pairs("english", 2)])
    b = write_jsonl(tmp_path / "b.jsonl", [r | {"g": "same"} for r in chatterbot_pairs("spanish", 2)])
    cfg = DataConfig(target=SourceConfig(kind="chatterbot", include=["marathi"]),
                     candidates=[SourceConfig(kind="jsonl", path=str(a), group_by="g"),
                                 SourceConfig(kind="jsonl", path=str(b), group_by="g")])
    with pytest.raises(DataError, match="duplicate group name 'same'"):
        resolve_groups(cfg)


def test_target_must_be_one_group_and_not_a_candidate():
    cfg = DataConfig(target=SourceConfig(kind="chatterbot"), candidates=[SourceConfig(kind="chatterbot")])
    with pytest.raises(DataError, match="exactly one group"):
        resolve_groups(cfg)
    cfg = DataConfig(target=SourceConfig(kind="chatterbot", include=["marathi"]),
                     candidates=[SourceConfig(kind="chatterbot", include=["marathi", "hindi"])])
    with pytest.raises(DataError, match="also the target"):
        resolve_groups(cfg)


def test_unknown_include_is_an_error():
    with pytest.raises(DataError, match="unknown group"):
        load_source(SourceConfig(kind="chatterbot", include=["klingon"]))


def test_split_and_previews_are_seeded():
    g = load_source(SourceConfig(kind="chatterbot", include=["marathi"]))["marathi"]
    tr1, va1 = split_target(g, 0.3, seed=0)
    tr2, va2 = split_target(g, 0.3, seed=0)
    assert tr1 == tr2 and va1 == va2 and len(va1) == 32 and not set(tr1) & set(va1)
    assert split_target(g, 0.3, seed=1)[1] != va1
    assert list(preview_indices(50, 8, 0, "x")) == list(preview_indices(50, 8, 0, "x"))
    assert list(preview_indices(50, 8, 0, "x")) != list(preview_indices(50, 8, 0, "y"))


def test_labels_cover_only_the_response(smollm2_dir):
    from convalue.engine.model.loading import load_tokenizer

    tok = load_tokenizer(smollm2_dir)
    t = tokenize_example(tok, Example((("user", "What is your name?"), ("assistant", "I am a bot."))), 128)
    labelled = tok.decode([i for i, lab in zip(t.input_ids, t.labels) if lab != IGNORE])
    assert labelled == "I am a bot.<|im_end|>"
    assert "What is your name" not in labelled
    cut = tokenize_example(tok, Example((("user", "word " * 200), ("assistant", "answer"))), 32)
    assert len(cut) == 32 and cut.n_response == 0


def test_a_chat_template_that_is_not_prefix_stable_is_a_model_error(smollm2_dir):
    from convalue.engine.model.loading import ModelError, load_tokenizer

    tok = load_tokenizer(smollm2_dir)
    # a template that numbers the conversation's length up front renders a prefix differently from the whole
    tok.chat_template = ("{{ messages|length }}\n{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n"
                         "{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}")
    with pytest.raises(ModelError, match="chat template is not prefix-stable"):
        tokenize_example(tok, Example((("user", "What is your name?"), ("assistant", "I am a bot."))), 128)


def _prep_cfg(tmp_path, target_rows, pool_rows, **kw):
    t = write_jsonl(tmp_path / "target.jsonl", target_rows)
    p = write_jsonl(tmp_path / "pool.jsonl", pool_rows)
    return DataConfig(target=SourceConfig(kind="jsonl", path=str(t)),
                      candidates=[SourceConfig(kind="jsonl", path=str(p), group_by="g")], **kw)


def test_group_with_fewer_than_m_examples(tmp_path, smollm2_dir):
    from convalue.engine.model.loading import load_tokenizer

    tok = load_tokenizer(smollm2_dir)
    pairs = chatterbot_pairs("english", 8)
    pool = [r | {"g": "big"} for r in pairs[:6]] + [r | {"g": "small"} for r in pairs[6:]]
    target = chatterbot_pairs("marathi", 10)
    with pytest.raises(DataError, match="'small'.*2 usable example.*preview_size=4"):
        prepare(_prep_cfg(tmp_path, target, pool, preview_size=4), tok, 128)
    skipped = prepare(_prep_cfg(tmp_path, target, pool, preview_size=4, small_groups="skip"), tok, 128)
    assert skipped.names() == ["big"] and any("skipped" in w for w in skipped.warnings)
    kept = prepare(_prep_cfg(tmp_path, target, pool, preview_size=4, small_groups="keep"), tok, 128)
    assert kept.names() == ["big", "small"] and len(kept.items[1].examples) == 2


def test_target_with_no_response_tokens(tmp_path, smollm2_dir):
    from convalue.engine.model.loading import load_tokenizer

    tok = load_tokenizer(smollm2_dir)
    target = [{"prompt": p["prompt"], "response": ""} for p in chatterbot_pairs("marathi", 10)]
    pool = [r | {"g": "a"} for r in chatterbot_pairs("english", 4)]
    with pytest.raises(DataError, match="target group .* has no response tokens"):
        prepare(_prep_cfg(tmp_path, target, pool, preview_size=2), tok, 64)


def test_target_examples_that_lose_their_response_are_counted_in_a_warning(tmp_path, smollm2_dir):
    """A target example whose response is cut off by max_length is not trained on, and the run says so (a target
    of 8 must not become 6 in silence)."""
    from convalue.engine.model.loading import load_tokenizer

    tok = load_tokenizer(smollm2_dir)
    target = chatterbot_pairs("marathi", 10)
    target[0] = target[0] | {"prompt": " ".join(["word"] * 200)}  # longer than the context: no response left
    pool = [r | {"g": "a"} for r in chatterbot_pairs("english", 4)]
    data = prepare(_prep_cfg(tmp_path, target, pool, preview_size=2), tok, 64)
    assert len(data.target_train) + len(data.target_val) == 9
    assert [w for w in data.warnings if re.match(r"target group .* (train|validation) split: 1 of \d+ example\(s\) "
                                                  r"without response tokens", w)], data.warnings


def _imported_modules(path: Path) -> set[str]:
    """Every module a source file imports at run time, at the top or inside a function (not under TYPE_CHECKING);
    `from package import name` counts as importing package.name too (name may be a module)."""
    out: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(encoding="utf-8")))
    return out


def test_no_data_module_imports_one_that_imports_it_back():
    """The data modules' imports go one way (examples <- clustering <- sources <- prepare): no import chain, through
    any convalue module, leads from a data module back to itself."""
    root = Path(convalue.__file__).parent
    files = [root / "__init__.py", root / "__main__.py"]
    files += [f for d in ("engine", "actors", "solvers") for f in (root / d).rglob("*.py")]
    modules = {}
    for f in files:
        parts = ("convalue",) + f.relative_to(root).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    graph = {m: sorted(n for n in _imported_modules(f) if n in modules and n != m) for m, f in modules.items()}
    data = sorted(m for m in modules if m.startswith("convalue.engine.data."))
    assert "convalue.engine.data.examples" in data and "convalue.engine.data.sources" in data
    for start in data:
        stack, seen = [(start, [start])], set()
        while stack:
            m, chain = stack.pop()
            for n in graph[m]:
                assert n != start, f"import cycle: {' -> '.join(chain + [n])}"
                if n not in seen:
                    seen.add(n)
                    stack.append((n, chain + [n]))


def test_the_corpus_reads_the_same_through_libyaml_as_through_pyyaml():
    """The chatterbot source parses with libyaml's safe loader where PyYAML has it: the same data as PyYAML's own."""
    import yaml

    from convalue.engine.data.sources import SAFE_LOADER, chatterbot_root

    files = sorted(chatterbot_root().glob("*/*.yml"))
    assert len(files) > 200
    for f in files:
        text = f.read_text("utf-8")
        assert yaml.load(text, Loader=SAFE_LOADER) == yaml.safe_load(text), f
