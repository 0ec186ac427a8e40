"""What the tests that run `convalue` as a user does share: the console script, a free loopback port, a config file,
and a Ray head of their own (`ray start --head`), stopped with every process it started."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psutil
import yaml

from convalue.engine.driver.cluster import ClusterError, check_reachable

#: the `convalue` console script of this environment
CONVALUE = str(Path(sys.executable).with_name("convalue"))
ROOT = Path(__file__).resolve().parents[1]


def bench_json(script: str, *args: str, timeout: int = 300) -> dict:
    """Run bench/<script> with args and return the JSON line it ends with (its stderr where it fails)."""
    done = subprocess.run([sys.executable, str(ROOT / "bench" / script), *args],
                          capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"bench/{script} exited {done.returncode}:\n{done.stderr[-4000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def free_port() -> int:
    """A TCP port nothing listens on (on loopback) just now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_config(path: Path, data: dict) -> Path:
    """A run config file (YAML) holding data."""
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def run_convalue(args: list[str], env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    """`convalue ARGS` in a subprocess, its output captured (a hang fails the test at `timeout`)."""
    return subprocess.run([CONVALUE, *args], capture_output=True, text=True, timeout=timeout,
                          env=env if env is not None else dict(os.environ))


@dataclass(frozen=True)
class Head:
    """A running Ray head: its GCS address and its metrics export port."""

    address: str
    metrics_port: int


@contextmanager
def ray_head(log: Path, num_cpus: int = 4) -> Iterator[Head]:
    """`ray start --head --block` on loopback with a metrics export port, metrics reported each second; stopped
    (with every process it started) on the way out."""
    port, metrics = free_port(), free_port()
    # this head's processes carry this path (short: Ray's socket paths must fit 107 bytes)
    temp = Path(tempfile.mkdtemp(prefix="cv-head-"))
    env = dict(os.environ) | {"RAY_metrics_report_interval_ms": "1000", "RAY_USAGE_STATS_ENABLED": "0"}
    ray_cli = str(Path(sys.executable).with_name("ray"))
    head = subprocess.Popen([ray_cli, "start", "--head", f"--port={port}", f"--metrics-export-port={metrics}",
                             f"--num-cpus={num_cpus}", "--include-dashboard=false", f"--temp-dir={temp}",
                             "--object-store-memory=268435456", "--block"],
                            env=env, stdout=subprocess.DEVNULL, stderr=log.open("w"))
    address = f"127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                check_reachable(address, "the test", timeout=2.0)
                break
            except ClusterError:
                assert time.monotonic() < deadline and head.poll() is None, log.read_text()[-3000:]
                time.sleep(1.0)
        yield Head(address, metrics)
    finally:
        try:
            started = psutil.Process(head.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            started = []
        head.send_signal(signal.SIGTERM)
        try:  # `ray start --block` stops its processes one at a time; whatever is left after 5 s is killed below
            head.wait(timeout=5)
        except subprocess.TimeoutExpired:
            head.kill()
        for p in started:  # workers outlive their raylet for a moment: none is left behind
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        shutil.rmtree(temp, ignore_errors=True)
