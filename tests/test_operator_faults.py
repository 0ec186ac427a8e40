"""More of what an operator meets, for real: a fine-tune task killed mid-run, `run` on a read-only run folder, the
submit script's command and token, and job logs free of per-fine-tune warnings."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
import warnings
from pathlib import Path

import pytest
from conftest import chatterbot_pairs
from test_faults import (
    CONVALUE,
    _config_file,
    _without_file_permission_override,
    stored_vectors,
)

from convalue.engine.config import config_from_dict
from convalue.engine.driver.pipeline import run

pytestmark = pytest.mark.heavy  # whole runs: scheduled before the light modules (conftest.py)

ROOT = Path(__file__).resolve().parents[1]


def _finetune_pids() -> list[int]:
    """This Ray session's processes running a fine-tune task now (the raylet's children; Ray titles a task's worker
    `ray::<function>` while it runs). Other Ray instances on the machine are left alone."""
    import psutil
    import ray

    raylet = ray._private.worker._global_node.all_processes["raylet"][0].process.pid
    found = []
    for child in psutil.Process(raylet).children(recursive=True):
        try:
            if "ray::run_finetune_job" in " ".join(child.cmdline()):
                found.append(child.pid)
        except psutil.Error:
            continue
    return found


def test_a_killed_fine_tune_task_is_retried_recorded_and_gives_the_same_losses(first_run, tmp_path):
    """SIGKILL the process of a running fine-tune task: Ray retries it, the run records the retry, and every
    fine-tune's loss equals an undisturbed run's (each job is seeded: a retry trains the same model). Both runs
    read the first run's vectors back (the fault is in the fine-tunes): no gradient worker starts."""
    base = first_run[1] | {"out": str(tmp_path / "runs"), "select": {"k": 1},
                           "finetune": {"enabled": True, "steps": 80, "batch_size": 2, "ks": [1],
                                        "baselines": ["target_only"]}}
    for name in ("clean", "hurt"):
        stored_vectors(first_run, tmp_path / "runs" / name)
    clean = run(config_from_dict(base | {"name": "clean"}))
    killed: list[int] = []

    def kill_a_task() -> None:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and not killed:
            pids = _finetune_pids()
            if pids:
                time.sleep(0.5)  # past its start (reported to the run), well inside its 80 steps
                try:
                    os.kill(pids[0], signal.SIGKILL)
                    killed.append(pids[0])
                except ProcessLookupError:
                    continue
                return
            time.sleep(0.05)

    killer = threading.Thread(target=kill_a_task, daemon=True)
    killer.start()
    hurt = run(config_from_dict(base | {"name": "hurt"}))
    killer.join(timeout=60)
    assert killed, "no fine-tune task was found to kill"
    assert hurt.status == "complete" and hurt.recovered["finetune"]["retries"] >= 1
    losses = {s.config["name"]: sorted((r["label"], r["val_loss"]) for r in s.finetune) for s in (clean, hurt)}
    assert losses["hurt"] == losses["clean"]
    assert clean.recovered is None
    assert clean.featurize["groups_computed"] == hurt.featurize["groups_computed"] == 0


def test_run_on_a_read_only_run_folder_is_a_clear_error(tiny_model_dir, tmp_path):
    cfg = _config_file(tmp_path, tiny_model_dir)
    run_dir = tmp_path / "runs" / "t"
    run_dir.mkdir(parents=True)
    run_dir.chmod(0o555)
    try:
        r = subprocess.run(_without_file_permission_override(*CONVALUE, "run", str(cfg)), capture_output=True,
                           text=True, timeout=300)
    finally:
        run_dir.chmod(0o755)
    assert r.returncode == 2 and "cannot be written by this process" in r.stderr and "Traceback" not in r.stderr
    assert not any(run_dir.iterdir())


@pytest.mark.parametrize("token_file, env, mode", [(True, {}, "token"), (False, {}, None),
                                                   (True, {"RAY_AUTH_TOKEN": "t0k"}, None)])
def test_submit_runs_the_convalue_script_and_sends_the_token(tmp_path, token_file, env, mode):
    """cluster/submit.sh, run with a stand-in `ray` first on PATH that records what it was called with: the job is
    `convalue run CONFIG ...` (never `python -m`), and RAY_AUTH_MODE=token is set where only the token file is."""
    bin_dir, home = tmp_path / "bin", tmp_path / "home"
    bin_dir.mkdir()
    (home / ".ray").mkdir(parents=True)
    if token_file:
        (home / ".ray" / "auth_token").write_text("secret")
    record = tmp_path / "called"
    fake = bin_dir / "ray"
    fake.write_text(f'#!/usr/bin/env bash\necho "MODE=${{RAY_AUTH_MODE:-}}" > {record}\nprintf "%s\\n" "$@" >> {record}\n')
    fake.chmod(0o755)
    environ = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(home), **env}
    r = subprocess.run([str(ROOT / "cluster" / "submit.sh"), "http://head:8265", "examples/demo.yaml", "--dry-run"],
                       env=environ, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    lines = record.read_text().splitlines()
    assert lines[0] == f"MODE={mode or ''}"
    job = lines[lines.index("--") + 1:]
    assert job == ["convalue", "run", "examples/demo.yaml", "--dry-run"]
    assert lines[lines.index("--address") + 1] == "http://head:8265"


def test_a_fine_tune_warns_nothing(tiny_model_dir):
    """Job logs carried a torch UserWarning per fine-tune (float() of a loss that requires grad) and a transformers
    FutureWarning per worker: a fine-tune on a freshly loaded replica now emits no warning at all."""
    from convalue.engine.config import FinetuneConfig, LoraConfig
    from convalue.engine.data.examples import Example
    from convalue.engine.data.tokenize import tokenize_examples
    from convalue.engine.model.loading import load_model, load_tokenizer
    from convalue.engine.protocol.finetune import finetune

    tok = load_tokenizer(tiny_model_dir)
    rows = tokenize_examples(tok, [Example((("user", p), ("assistant", a))) for p, a in
                                   chatterbot_pairs_as_text()], 64)
    cfg = FinetuneConfig(steps=3, batch_size=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = load_model(tiny_model_dir)
        finetune(model, tok.pad_token_id, cfg, LoraConfig(r=4, alpha=8), label="t", target=rows[:4],
                 aux={"g": rows[4:]}, val=rows[:2])
    assert [f"{w.category.__name__}: {w.message}" for w in caught] == []


def chatterbot_pairs_as_text() -> list[tuple[str, str]]:
    """Six real chatterbot prompt/response pairs."""
    return [(r["prompt"], r["response"]) for r in chatterbot_pairs("english", 6)]
