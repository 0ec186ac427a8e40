"""Hostile inputs from an operator's sweep (issue 50): each refused with one `convalue: error:` line naming the file,
field, line or group, exit code 2, and nothing complete-looking left behind; user code named in a config imported
only by a run about to call it."""

from __future__ import annotations

import pytest

from convalue.engine.config import ConfigError, load_config
from convalue.engine.driver.cli import main


def _refused(capsys, argv: list[str]) -> str:
    """The one error line of a refused command (exit code 2, no traceback)."""
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("convalue: error: ") and "\n" not in err and "Traceback" not in err, err
    return err


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
