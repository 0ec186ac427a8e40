"""What the driver checks of a cluster before giving it work, through the real console script: an address where no
Ray answers (a web server, nothing, a server that never answers, a dashboard URL) is one `convalue: error:` line
and exit 2 in seconds, Ctrl-C stops the wait; a worker larger than any node is refused, naming the field and the
node."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from conftest import tiny_run_config
from run_helpers import CONVALUE, free_port, run_convalue, write_config

from convalue.engine.config import ConfigError, config_from_dict
from convalue.engine.driver.cluster import NodeShape, check_fits, cluster_nodes

PROBE = "something listens there, but not a Ray GCS (HOST:6379 by default, the address `ray start --head` prints)"


@pytest.fixture
def config(tiny_model_dir, pool_jsonl, target_jsonl, tmp_path) -> Path:
    """A run config a run would accept (it never gets as far as loading the model here)."""
    return write_config(tmp_path / "run.yaml", tiny_run_config(tmp_path, tiny_model_dir, target_jsonl, pool_jsonl))


@pytest.fixture
def web_server() -> Iterator[int]:
    """A plain HTTP server on loopback (a web server, not Ray); its port."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), SimpleHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


class SilentServer:
    """A TCP server that accepts connections and never sends a byte (a hung service, or a firewall's proxy)."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.accepted: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                self.accepted.append(self.sock.accept()[0])
            except OSError:  # closed
                return

    def close(self) -> None:
        self.sock.close()
        for conn in self.accepted:
            conn.close()


@pytest.fixture
def silent_server() -> Iterator[SilentServer]:
    server = SilentServer()
    yield server
    server.close()


def env_without_cluster() -> dict[str, str]:
    """This environment without a RAY_ADDRESS (so only what a test gives names a cluster)."""
    return {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}


def one_error_line(done: subprocess.CompletedProcess) -> str:
    """The refusal: exit 2, and stderr one `convalue: error:` line without a traceback."""
    assert done.returncode == 2, done.stderr[-3000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("convalue: error: "), done.stderr[-3000:]
    return lines[0]


@pytest.mark.parametrize("given", ["--address", "RAY_ADDRESS", "ray.address"])
def test_an_address_where_a_web_server_listens_is_refused_naming_it(config, web_server, given):
    """ray.init would wait for a GCS there for minutes, deaf to Ctrl-C."""
    address = f"127.0.0.1:{web_server}"
    args, env = ["run", str(config)], env_without_cluster()
    if given == "--address":
        args += ["--address", address]
    elif given == "RAY_ADDRESS":
        env["RAY_ADDRESS"] = address
    else:
        args += ["--set", f"ray.address={address}"]
    line = one_error_line(run_convalue(args, env=env, timeout=120))
    assert line.startswith(f"convalue: error: no Ray cluster answers at {address} (given by {given}): {PROBE}: "
                           "UNAVAILABLE"), line


def test_an_address_where_nothing_listens_is_refused_naming_it(config):
    port = free_port()
    line = one_error_line(run_convalue(["run", str(config), "--address", f"127.0.0.1:{port}"],
                                       env=env_without_cluster(), timeout=120))
    assert line.startswith(f"convalue: error: cannot reach a Ray cluster at 127.0.0.1:{port} (given by --address): "
                           "[Errno 111] Connection refused; start one with `ray start --head`"), line


def test_a_server_that_never_answers_is_refused_when_the_probe_gives_up(config, silent_server):
    address = f"127.0.0.1:{silent_server.port}"
    line = one_error_line(run_convalue(["run", str(config), "--address", address], env=env_without_cluster(),
                                       timeout=120))
    assert line.startswith(f"convalue: error: no Ray cluster answers at {address} (given by --address): {PROBE}: "
                           "DEADLINE_EXCEEDED"), line


def test_ctrl_c_while_waiting_for_a_server_that_never_answers_stops_the_command(config, silent_server):
    run = subprocess.Popen([CONVALUE, "run", str(config), "--address", f"127.0.0.1:{silent_server.port}"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env_without_cluster())
    deadline = time.monotonic() + 120
    while len(silent_server.accepted) < 2:  # the reachability check's connection, then the Ray probe's
        assert run.poll() is None and time.monotonic() < deadline, run.communicate()[1][-3000:]
        time.sleep(0.05)
    run.send_signal(signal.SIGINT)
    _, err = run.communicate(timeout=60)
    assert run.returncode == 130, err[-3000:]
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith("convalue: stopped by SIGINT"), err


def test_a_dashboard_url_given_as_the_address_is_refused_pointing_at_job_submission(config):
    line = one_error_line(run_convalue(["run", str(config), "--address", "http://127.0.0.1:8265"],
                                       env=env_without_cluster(), timeout=120))
    assert line == ("convalue: error: http://127.0.0.1:8265 (given by --address) is an HTTP address, such as a Ray "
                    "dashboard's; give the cluster's GCS address (HOST:6379 by default, or `auto` on one of its "
                    "nodes), or submit the run to a dashboard with cluster/submit.sh")


def test_a_worker_larger_than_this_machine_is_refused_before_an_embedded_cluster_starts(config):
    done = run_convalue(["run", str(config), "--set", "ray.cpus_per_worker=1000"], env=env_without_cluster())
    assert done.returncode == 2, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last == (f"convalue: error: {config}: ray.cpus_per_worker: asks 1000 CPUs per worker, more than the "
                    f"cluster's largest node has (this machine: {os.cpu_count()} CPUs) (got 1000)")
    assert "Traceback" not in done.stderr


def test_a_worker_must_fit_the_largest_node_live_or_to_come(ray_session, tiny_model_dir, tmp_path):
    """The live nodes (here the tests' local Ray: 4 logical CPUs, no GPU), and the node types an autoscaler may
    start (a cluster whose workers scale from zero has no live worker yet)."""
    data = tiny_run_config(tmp_path, tiny_model_dir, tmp_path / "t.jsonl", tmp_path / "p.jsonl")
    for name in ("t.jsonl", "p.jsonl"):
        (tmp_path / name).write_text('{"prompt": "a", "response": "b", "group": "g"}\n')
    live = cluster_nodes()
    assert [n.cpus for n in live] == [4.0] and live[0].name.startswith("node ")
    check_fits(config_from_dict(data | {"ray": {"cpus_per_worker": 4}}), live)
    with pytest.raises(ConfigError, match=r"ray.cpus_per_worker: asks 5 CPUs per worker, more than the cluster's "
                                          r"largest node has \(node [\d.]+: 4 CPUs\) \(got 5\)"):
        check_fits(config_from_dict(data | {"ray": {"cpus_per_worker": 5}}), live)
    scaled = [NodeShape("node 10.0.0.1", 0.0, 0.0), NodeShape("node type cpu_workers", 16.0, 0.0),
              NodeShape("node type gpu_workers", 4.0, 1.0)]
    check_fits(config_from_dict(data | {"ray": {"cpus_per_worker": 16, "gpus_per_worker": 1}}), scaled)
    with pytest.raises(ConfigError, match=r"ray.gpus_per_worker: asks 2 GPUs per worker, more than the cluster's "
                                          r"largest node has \(node type gpu_workers: 1 GPU\) \(got 2.0\)"):
        check_fits(config_from_dict(data | {"ray": {"gpus_per_worker": 2}}), scaled)
