"""Hostile inputs from an operator's sweep (issue 50): each refused with one `convalue: error:` line naming the file,
field, line or group, exit code 2, and nothing complete-looking left behind; user code named in a config imported
only by a run about to call it."""

from __future__ import annotations

import pytest
import yaml
from conftest import tiny_run_config

from convalue.engine.config import ConfigError, load_config
from convalue.engine.driver.cli import main
from convalue.engine.features.rewards import RewardError, check_rewards, load_reward


def _refused(capsys, argv: list[str]) -> str:
    """The one error line of a refused command (exit code 2, no traceback)."""
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("convalue: error: ") and "\n" not in err and "Traceback" not in err, err
    return err


def _write(tmp_path, data: dict, name: str = "run.yaml") -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


# --- duplicate keys in YAML ---------------------------------------------------------------------------------


def test_a_key_given_twice_is_refused_with_both_lines(capsys, tmp_path):
    # a second `solver:` would silently drop the first's `normalize: cosine`
    (tmp_path / "run.yaml").write_text("name: x\nsolver:\n  normalize: cosine\nselect: {k: 2}\nsolver:\n  gamma: 0.1\n")
    cfg = str(tmp_path / "run.yaml")
    err = _refused(capsys, ["run", cfg, "--dry-run"])
    assert err == (f"convalue: error: {cfg}: solver: is given twice in one mapping (lines 2 and 5); YAML would keep "
                   "only the last, so merge the two into one")
    assert _refused(capsys, ["run", cfg]) == err
    assert not (tmp_path / "runs").exists()


def test_a_nested_key_given_twice_is_named_by_its_path(tmp_path):
    (tmp_path / "nested.yaml").write_text("name: x\ndata:\n  candidates:\n    - {path: a.jsonl, path: b.jsonl}\n")
    with pytest.raises(ConfigError) as err:
        load_config(tmp_path / "nested.yaml")
    assert str(err.value) == (f"{tmp_path / 'nested.yaml'}: data.candidates.0.path: is given twice in one mapping "
                              "(line 4, columns 8 and 23); YAML would keep only the last, so merge the two into one")


def test_a_set_value_with_a_key_given_twice_is_refused(capsys, tmp_path):
    (tmp_path / "ok.yaml").write_text("name: x\n")
    err = _refused(capsys, ["run", str(tmp_path / "ok.yaml"), "--dry-run", "--set",
                            "solver={normalize: cosine, normalize: none}"])
    assert err.startswith(f"convalue: error: {tmp_path / 'ok.yaml'}: --set solver: normalize is given twice in one "
                          "mapping (line 1, columns 2 and 21)")


def test_merge_keys_and_aliases_are_still_read(tmp_path):
    (tmp_path / "merge.yaml").write_text("name: x\nsolver: &s {gamma: 0.5, normalize: cosine}\n"
                                         "bootstrap:\n  samples: 0\nselect: {k: 1}\n"
                                         "projection: {<<: {kind: countsketch, dim: 64}, dim: 128}\n"
                                         "data: {target: {kind: chatterbot, include: [marathi]},"
                                         " candidates: [{kind: chatterbot}]}\n")
    cfg = load_config(tmp_path / "merge.yaml")
    assert (cfg.projection.dim, cfg.solver.normalize) == (128, "cosine")


# --- user reward code ---------------------------------------------------------------------------------------


def _reward_file(tmp_path) -> tuple[str, object]:
    """A reward file whose import leaves a marker file: (its path, the marker)."""
    marker = tmp_path / "imported.marker"
    (tmp_path / "my_reward.py").write_text(
        "from pathlib import Path\n"
        "Path(__file__).with_name('imported.marker').write_text('imported')\n\n"
        "def acc(completion, reference):\n    return 1.0\n")
    return "my_reward.py:acc", marker


def test_a_reward_file_is_not_imported_by_validation_or_the_dry_run(capsys, tiny_model_dir, pool_jsonl,
                                                                     target_jsonl, tmp_path):
    spec, marker = _reward_file(tmp_path)
    data = tiny_run_config(tmp_path, tiny_model_dir, target_jsonl, pool_jsonl,
                           features={"grpo_reward": spec},
                           finetune={"enabled": False, "steps": 3, "batch_size": 2, "metrics": ["loss", "accuracy"],
                                     "accuracy_reward": spec, "objective": "grpo", "grpo_reward": spec})
    cfg = _write(tmp_path, data)
    loaded = load_config(cfg)
    assert main(["run", cfg, "--dry-run"]) == 0
    assert main(["run", cfg, "--dry-run", "--set", "finetune.enabled=true"]) == 0
    assert not marker.exists()
    assert not (tmp_path / "runs").exists()
    # a run about to fine-tune loads it (the marker shows the test would see an import)
    enabled = load_config(cfg, ["finetune.enabled=true"])
    check_rewards(loaded)
    assert not marker.exists()  # fine-tuning disabled, a one_step representation: no reward is called
    check_rewards(enabled)
    assert marker.exists()


def test_a_reward_must_be_a_function_of_the_users_own_module_or_file(tmp_path):
    (tmp_path / "reexport.py").write_text("from os.path import join as acc\n")
    for spec, says in [("os:system", "'os' is a module of Python's standard library, not a reward"),
                       ("os:getenv", "'os' is a module of Python's standard library, not a reward"),
                       (f"{tmp_path / 'reexport.py'}:acc", "names posixpath.join, not a function defined in")]:
        try:
            load_reward(spec)
        except RewardError as exc:
            assert says in str(exc), exc
        else:
            raise AssertionError(f"{spec} was accepted as a reward")


def test_a_run_refuses_a_bad_reward_before_featurising(capsys, tiny_model_dir, pool_jsonl, target_jsonl, tmp_path):
    data = tiny_run_config(tmp_path, tiny_model_dir, target_jsonl, pool_jsonl,
                           finetune={"enabled": True, "steps": 3, "batch_size": 2, "metrics": ["loss", "accuracy"],
                                     "accuracy_reward": "os:system"})
    cfg = _write(tmp_path, data)
    err = _refused(capsys, ["run", cfg])
    assert err == (f"convalue: error: {cfg}: finetune.accuracy_reward: 'os' is a module of Python's standard "
                   "library, not a reward: name a function defined in your own module or file")
    assert not (tmp_path / "runs").exists()  # refused before the run folder, Ray or featurisation


# --- a 50 MB line ---------------------------------------------------------------------------------------------

_READ_AND_TOKENIZE = """
import json, sys
from pathlib import Path
from convalue.engine.config import SourceConfig
from convalue.engine.data.sources import load_source
from convalue.engine.data.tokenize import tokenize_examples
from convalue.engine.model.loading import load_tokenizer

def kib(field):  # this process's own memory (VmHWM: its peak RSS since exec, unlike ru_maxrss, or since a reset)
    line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith(field + ":"))
    return int(line.split()[1])

tokenizer = load_tokenizer(sys.argv[1])
try:
    Path("/proc/self/clear_refs").write_text("5")  # reset the peak to now: loading the tokenizer peaked higher
except OSError:
    pass
before = kib("VmRSS")
(group,) = load_source(SourceConfig(kind="jsonl", path=sys.argv[2])).values()
(tok,) = tokenize_examples(tokenizer, group.examples, 128)
print(json.dumps({"grown": (kib("VmHWM") - before) * 1024, "ids": tok.input_ids, "labels": tok.labels}))
"""


def test_a_50_mb_line_is_tokenised_in_bounded_memory(tiny_model_dir, tmp_path):
    """The text is cut before it is tokenised: the peak memory of reading and tokenising one 50 MB line grows by far
    less than the 6.6 GB that tokenising the whole text took, and its tokens are the whole text's first 128."""
    import json
    import os
    import subprocess
    import sys

    from convalue.engine.data.examples import Example
    from convalue.engine.data.tokenize import CHARS_PER_TOKEN, tokenize_example
    from convalue.engine.model.loading import load_tokenizer

    sentence = "The quick brown fox, 12 times over, jumps past the lazy dog at dawn. "
    response = sentence * (50_000_000 // len(sentence) + 1)
    path = tmp_path / "huge.jsonl"
    path.write_text(json.dumps({"prompt": "Tell me a story.", "response": response}) + "\n")
    assert path.stat().st_size > 50_000_000
    del response
    out = subprocess.run([sys.executable, "-c", _READ_AND_TOKENIZE, str(tiny_model_dir), str(path)],
                         capture_output=True, text=True, timeout=600, env=os.environ | {"TOKENIZERS_PARALLELISM": "false"})
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["grown"] < 2**30, f"reading and tokenising took {got['grown'] / 2**20:.0f} MiB above the baseline"
    # the first 128 tokens of the whole text: those of a short version that is tokenised whole (not cut)
    short = sentence * (128 * CHARS_PER_TOKEN // len(sentence) - 1)
    expected = tokenize_example(load_tokenizer(tiny_model_dir), Example((("user", "Tell me a story."),
                                                                         ("assistant", short))), 128)
    assert len(short) < 128 * CHARS_PER_TOKEN and len(expected) == 128 and expected.n_response > 64
    assert (tuple(got["ids"]), tuple(got["labels"])) == (expected.input_ids, expected.labels)


# --- a projection wider than its input ----------------------------------------------------------------------


def test_a_projection_dim_above_the_parameter_count_is_refused(capsys, ray_session, tiny_model_dir, pool_jsonl,
                                                               target_jsonl, tmp_path):
    # the tiny Llama's LoRA (r 4 on q_proj and v_proj, 2 layers) has 2 x (64 + 32) x 4 = 768 lora_B parameters
    data = tiny_run_config(tmp_path, tiny_model_dir, target_jsonl, pool_jsonl,
                           projection={"kind": "countsketch", "dim": 1000, "seed": 0})
    config = _write(tmp_path, data)
    for args in (["run", config, "--dry-run"], ["run", config]):  # read from the checkpoint: no worker asked
        err = _refused(capsys, args)
        assert err.endswith("projection.dim: is larger than the 768 parameters featurised: a projection cannot add "
                            "dimensions; use a dim of at most 768, or kind `identity` (got 1000)")
    run_dir = tmp_path / "runs" / "t"
    assert not (run_dir / "scores.parquet").exists() and not list(run_dir.glob("vectors/*.npy"))


# --- data sources -------------------------------------------------------------------------------------------


def test_an_empty_include_list_is_refused_at_validation(capsys, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"prompt": ["a", "b"], "response": ["c", "d"], "group": ["x", "y"]}),
                   tmp_path / "small.parquet")
    (tmp_path / "run.yaml").write_text(
        "name: x\ndata:\n  target: {kind: chatterbot, include: [marathi]}\n"
        "  candidates: [{kind: parquet, path: small.parquet, group_by: group, include: []}]\n")
    err = _refused(capsys, ["run", str(tmp_path / "run.yaml"), "--dry-run"])
    assert err == (f"convalue: error: {tmp_path / 'run.yaml'}: data.candidates[0].include: is empty, so it would keep "
                   "no group: list the groups to keep, or leave it out to keep them all (got [])")


def _gzipped_rows(level: int) -> tuple[bytes, bytes]:
    """(the text of 60 JSON Lines rows, its gzip stream at compression level `level`; 0 stores the text as is)."""
    import gzip
    import json

    text = "".join(json.dumps({"prompt": f"question {i}", "response": f"answer {i}"}) + "\n" for i in range(1, 61))
    return text.encode(), gzip.compress(text.encode(), compresslevel=level, mtime=0)


def test_a_truncated_or_corrupt_gzip_is_named_as_such(tmp_path):
    from convalue.engine.config import SourceConfig
    from convalue.engine.data.examples import DataError
    from convalue.engine.data.sources import load_source

    _, stream = _gzipped_rows(9)
    (tmp_path / "cut.jsonl.gz").write_bytes(stream[: len(stream) // 2])
    # a stored (level 0) stream with one byte of line 26 changed: only the gzip CRC at its end can tell, and the
    # text read before it fails to parse at line 26 (which is what was reported)
    _, stored = _gzipped_rows(0)
    damaged = bytearray(stored)
    damaged[stored.index(b'{"prompt": "question 26"')] = ord("[")
    (tmp_path / "flipped.jsonl.gz").write_bytes(bytes(damaged))
    (tmp_path / "garbage.json.gz").write_bytes(stream[:10] + bytes(range(256)) * 4)
    for name, why in [("cut.jsonl.gz", "it ends before its end-of-stream marker: the file was cut short"),
                      ("flipped.jsonl.gz", "CRC check failed"), ("garbage.json.gz", "Error -3 while decompressing")]:
        with pytest.raises(DataError) as err:
            load_source(SourceConfig(kind=name.split(".")[1], path=str(tmp_path / name)))
        assert str(err.value).startswith(f"{tmp_path / name}: truncated or corrupt gzip file ({why}"), err.value


def test_a_run_on_a_truncated_gzip_says_so_in_one_line(capsys, tiny_model_dir, pool_jsonl, tmp_path):
    _, stream = _gzipped_rows(9)
    (tmp_path / "target.jsonl.gz").write_bytes(stream[: len(stream) // 2])
    data = tiny_run_config(tmp_path, tiny_model_dir, tmp_path / "target.jsonl.gz", pool_jsonl)
    err = _refused(capsys, ["run", _write(tmp_path, data), "--dry-run"])
    assert f"{tmp_path / 'target.jsonl.gz'}: truncated or corrupt gzip file (it ends before" in err
    assert not (tmp_path / "runs").exists()


# --- convalue score -----------------------------------------------------------------------------------------


def test_score_names_the_group_whose_vector_is_not_finite(capsys, tmp_path):
    import json

    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    X = rng.normal(size=(4, 8))
    X[2, 5] = np.nan
    pq.write_table(pa.table({"group": ["a", "b", "c", "d"], "vector": [list(map(float, r)) for r in X]}),
                   tmp_path / "pool.parquet")
    np.save(tmp_path / "target.npy", rng.normal(size=8).astype(np.float32))
    err = _refused(capsys, ["score", str(tmp_path / "pool.parquet"), "--target", str(tmp_path / "target.npy"),
                            "--gamma-ratio", "0.1", "--out", str(tmp_path / "runs"), "--name", "nan"])
    assert err == (f"convalue: error: {tmp_path / 'pool.parquet'}: non-finite values (NaN or infinity) in the vector "
                   "of group(s) 'c'")
    summary = json.loads((tmp_path / "runs" / "nan" / "summary.json").read_text())
    assert summary["status"] == "failed" and not (tmp_path / "runs" / "nan" / "scores.parquet").exists()
