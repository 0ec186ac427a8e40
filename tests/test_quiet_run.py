"""`convalue run` on its embedded cluster as a user starts it (no RAY_AUTH_MODE, a fresh HOME): its output is
convalue's own lines only (no Ray token banner or token message, no "Started a local Ray instance", no DeepSpeed
warning, no other library's log line), every port the run's processes listen on is on loopback, and the Ray
token it makes is readable by its owner only; and the built-in model's conversion writes what save_pretrained
writes without importing DeepSpeed."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import time

import psutil
import pytest
from conftest import tiny_run_config
from run_helpers import CONVALUE, write_config

pytestmark = pytest.mark.heavy  # whole runs: scheduled before the light modules (conftest.py)

#: a line convalue logs (the CLI's format); stdout holds the results
OWN_LOG = re.compile(r"^\d\d:\d\d:\d\d convalue (INFO|WARNING|ERROR) ")
#: what other software printed in a run before: Ray's token banner and messages, its log lines, DeepSpeed's
THIRD_PARTY = re.compile(r"Token authentication|Generated new authentication token|Started a local Ray instance"
                         r"|Setting accelerator|DeepSpeed"
                         r"|fontManager|[Uu]sage stats|^\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d|^\[\d{4}-\d\d-\d\d"
                         r"|^\((raylet|pid=\d+|\w+ pid=\d+)")
LOOPBACK = {"127.0.0.1", "::ffff:127.0.0.1", "::1"}
def listening(root: int) -> set[tuple[str, int, str]]:
    """(address, port, process name) of every listening TCP socket of process `root` and its descendants (the
    embedded cluster's GCS, raylet, agents and workers are all started under the driver)."""
    try:
        procs = {p.pid: p for p in psutil.Process(root).children(recursive=True)} | {root: psutil.Process(root)}
    except psutil.NoSuchProcess:
        return set()
    out = set()
    for conn in psutil.net_connections(kind="tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.pid in procs:
            try:
                out.add((conn.laddr.ip, conn.laddr.port, procs[conn.pid].name()))
            except psutil.NoSuchProcess:
                continue
    return out


def test_an_embedded_run_says_only_its_own_lines_listens_on_loopback_and_keeps_its_token_private(
        tiny_model_dir, pool_jsonl, target_jsonl, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    # fine-tunes on (their processes print too), one call in flight: the two fine-tunes run one after the other in
    # one Ray worker, which imports torch and the model once (two in flight: two workers, each importing them)
    config = write_config(tmp_path / "run.yaml", tiny_run_config(
        tmp_path, tiny_model_dir, target_jsonl, pool_jsonl,
        finetune={"enabled": True, "steps": 2, "batch_size": 2, "ks": [1], "baselines": ["target_only"]},
        ray={"max_in_flight": 1}))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_AUTH", "RAY_ADDRESS"))} | {"HOME": str(home)}
    out, err = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    with out.open("w") as stdout, err.open("w") as stderr:
        run = subprocess.Popen([CONVALUE, "run", str(config)], stdout=stdout, stderr=stderr, env=env)
        ports: set[tuple[str, int, str]] = set()
        deadline = time.monotonic() + 900
        while run.poll() is None:
            assert time.monotonic() < deadline, "the run did not end"
            ports |= listening(run.pid)
            time.sleep(1.0)
    printed, logged = out.read_text(), err.read_text()
    assert run.returncode == 0, logged[-3000:]

    assert not [line for line in logged.splitlines() if line.strip() and not OWN_LOG.match(line)], logged
    assert not [line for line in (printed + logged).splitlines() if THIRD_PARTY.search(line)], printed + logged
    assert "selected (top-2 with positive score)" in printed

    names = {name for _, _, name in ports}
    assert {"gcs_server", "raylet"} <= names, ports  # the sockets of the run's own cluster were seen
    assert {ip for ip, _, _ in ports} <= LOOPBACK, sorted(ports)

    token = home / ".ray" / "auth_token"
    assert token.stat().st_mode & 0o777 == 0o600 and len(token.read_text()) == 64


def test_the_builtin_models_conversion_writes_what_save_pretrained_writes_without_importing_deepspeed(
        tiny_model_dir, tmp_path):
    """SmolLM2 is converted with save_model_files; save_pretrained would import DeepSpeed (where it is installed)
    through accelerate's unwrapping, and print its "Setting accelerator to CPU" warning."""
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    script = """
import sys
from pathlib import Path
from transformers import AutoModelForCausalLM
from convalue.engine.model.loading import save_model_files
model = AutoModelForCausalLM.from_pretrained(sys.argv[1])
Path(sys.argv[2]).mkdir()
save_model_files(model, Path(sys.argv[2]))
print("after save_model_files:", "deepspeed" in sys.modules)
model.save_pretrained(sys.argv[3])
print("after save_pretrained:", "deepspeed" in sys.modules)
"""
    done = subprocess.run([sys.executable, "-c", script, str(tiny_model_dir), str(ours), str(theirs)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "after save_model_files: False" in done.stdout
    if importlib.util.find_spec("deepspeed") is not None:  # the path the conversion leaves
        assert "after save_pretrained: True" in done.stdout
    assert sorted(p.name for p in ours.iterdir()) == sorted(p.name for p in theirs.iterdir()) == [
        "config.json", "generation_config.json", "model.safetensors"]
    for name in ("config.json", "generation_config.json", "model.safetensors"):
        assert (ours / name).read_bytes() == (theirs / name).read_bytes(), name
