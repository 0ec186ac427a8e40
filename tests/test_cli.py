"""The console entry point: clear errors with exit code 2, the config reference, the command registry, output into
a closed pipe, and what starting a command imports."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from convalue.engine.driver.cli import COMMANDS, _stdout_closed


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
    assert "Loading weights" not in r.stderr  # the model load it times draws no third-party progress bar
    assert not (tmp_path / "runs").exists()


CONSOLE_SCRIPT = Path(sys.executable).with_name("convalue")


def _failed_run(folder: Path) -> Path:
    """A run folder whose summary.json records a failure: `status` prints it without vectors or Ray."""
    folder.mkdir()
    (folder / "summary.json").write_text(json.dumps({"status": "failed", "config": {}, "failed_stage": "featurize",
                                                     "error": "boom"}))
    return folder


@pytest.mark.parametrize("command", ["status", "list", "config-reference"])
def test_output_into_a_closed_pipe_ends_quietly_with_141(tmp_path, command):
    run_dir = _failed_run(tmp_path / "r1")
    args = {"status": [str(run_dir)], "list": [str(tmp_path)], "config-reference": []}[command]
    line = " ".join(shlex.quote(a) for a in [str(CONSOLE_SCRIPT), command, *args])
    # head has its line (from echo) and is gone before convalue, which takes a second to start, writes anything
    r = subprocess.run(["bash", "-c", f"{{ echo first; {line}; }} | head -1; echo \"${{PIPESTATUS[0]}}\" >&2"],
                       capture_output=True, text=True)
    assert r.stdout == "first\n"
    assert r.stderr.strip() == "141", r.stderr  # no traceback, no "Exception ignored", no `convalue: error:`
    r = subprocess.run(["bash", "-c", f"{line} | head -1"], capture_output=True, text=True)
    assert r.returncode == 0 and "Traceback" not in r.stderr and "Broken pipe" not in r.stderr, r.stderr
    assert len(r.stdout.splitlines()) == 1


def test_a_broken_pipe_elsewhere_is_not_taken_for_stdout(monkeypatch):
    read, write = os.pipe()
    with os.fdopen(write, "w") as out:
        monkeypatch.setattr(sys, "stdout", out)
        assert not _stdout_closed()  # its reader is still there: a BrokenPipeError came from another pipe
        os.close(read)
        assert _stdout_closed()


def test_help_and_status_start_without_torch_ray_or_scipy(tmp_path):
    run_dir = _failed_run(tmp_path / "r1")
    probe = ("import sys\nfrom convalue.engine.driver.cli import main\n"
             "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
             f"code = main(['status', {str(run_dir)!r}])\n"
             "print(code, sorted(m for m in ('torch', 'ray', 'scipy', 'transformers') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.splitlines()[-1] == "1 []"
    assert f"{run_dir}: " in r.stdout  # the status was printed


def test_every_registered_command_has_its_subparser_in_order():
    r = cli("--help")
    assert r.returncode == 0 and "141" in r.stdout
    assert f"{{{','.join(COMMANDS)}}}" in r.stdout.replace("\n", "").replace(" ", "")
    assert list(COMMANDS) == ["run", "faithfulness", "transfer", "solve", "status", "score", "report", "list",
                              "config-reference"]


def test_the_driver_path_of_score_imports_no_ray(tmp_path):
    """`convalue score` certifies a grown pool's prior in the driver (engine.driver.prior) with its checks and stage
    timer, and the command line names what it refuses: none of them loads Ray or the actors, which only the cluster
    path imports (here the command refuses a missing vectors file, exit 2, after importing all of them)."""
    probe = ("import sys\nimport convalue.engine.driver.score, convalue.engine.driver.checks\n"
             "import convalue.engine.driver.prior, convalue.engine.driver.timer\n"
             "from convalue.engine.driver.cli import main\n"
             f"code = main(['score', {str(tmp_path / 'missing.parquet')!r}, '--out', {str(tmp_path)!r}, '--gamma', '0.01'])\n"
             "print(code, sorted(m for m in sys.modules if m == 'ray' or m.startswith('convalue.actors')))")
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.splitlines()[-1] == "2 []" and "missing.parquet: no such vectors file" in r.stderr
