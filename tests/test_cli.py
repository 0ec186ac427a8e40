"""The console entry point: clear errors with exit code 2, and the config reference."""

from __future__ import annotations

import subprocess
import sys

import yaml


def cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "convalue", *args], capture_output=True, text=True, cwd=cwd)


def test_bad_config_exits_2_naming_file_field_value(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text(yaml.safe_dump({"data": {"target": {"kind": "chatterbot"}, "candidates": [{"kind": "chatterbot"}]},
                                 "solver": {"gamma": -1}}))
    r = cli("run", str(p))
    assert r.returncode == 2
    assert f"{p}: solver.gamma: must be a finite number >= 0 (got -1.0)" in r.stderr
    assert not (tmp_path / "runs").exists()


def test_solve_on_missing_run_dir(tmp_path):
    r = cli("solve", str(tmp_path / "nothing"))
    assert r.returncode == 2 and "not a finished run folder" in r.stderr


def test_config_reference():
    r = cli("config-reference")
    assert r.returncode == 0 and "### `solver`" in r.stdout and "gamma" in r.stdout


def test_status_of_a_folder_without_a_run(tmp_path):
    r = cli("status", str(tmp_path))
    assert r.returncode == 2 and f"{tmp_path}: not a run folder (no summary.json)" in r.stderr
