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


def test_version_from_a_neutral_directory(tmp_path):
    import convalue

    r = cli("--version", cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == f"convalue {convalue.__version__}"
    for name in ("engine", "solvers", "actors"):  # only `convalue` lands at the top of site-packages
        probe = subprocess.run([sys.executable, "-c", f"import {name}"], capture_output=True, text=True, cwd=tmp_path)
        assert probe.returncode != 0 and "No module named" in probe.stderr


def test_dry_run_prints_the_plan_without_ray_or_a_run_folder(tiny_model_dir, pool_jsonl, target_jsonl, tmp_path):
    from conftest import tiny_run_config

    data = tiny_run_config(tmp_path, tiny_model_dir, target_jsonl, pool_jsonl,
                           finetune={"enabled": True, "steps": 3, "batch_size": 2, "ks": [1, 2],
                                     "baselines": ["target_only", "random"], "repeats": 2})
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(data))
    r = cli("run", str(tmp_path / "run.yaml"), "--dry-run")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "candidates: 4 groups" in r.stdout
    assert "fine-tunes: at most 10 (2 method(s) ['kmm', 'random'] x k in [1, 2] + target only x 2 seed(s)" in r.stdout
    assert "tokens/s per worker" in r.stdout and "ray" not in r.stderr.lower()
    assert not (tmp_path / "runs").exists()
