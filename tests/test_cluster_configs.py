"""The shipped cluster configs parse and pass Ray's own launcher schema; the RayJob has KubeRay's fields."""

from __future__ import annotations

from pathlib import Path

import yaml

CLUSTER = Path(__file__).parents[1] / "cluster"


def test_launcher_config_passes_ray_schema():
    from ray.autoscaler._private.util import prepare_config, validate_config

    # prepare_config fills Ray's defaults (cluster_synced_files, ...) as `ray up` does, then the schema check
    validate_config(prepare_config(yaml.safe_load((CLUSTER / "ray-cluster-aws.yaml").read_text())))


def test_rayjob_fields():
    claim, job = yaml.safe_load_all((CLUSTER / "rayjob.yaml").read_text())
    assert job["apiVersion"] == "ray.io/v1" and job["kind"] == "RayJob"
    spec = job["spec"]
    assert spec["entrypoint"].startswith("convalue run ")
    assert spec["rayClusterSpec"]["rayVersion"] == "2.60.0"
    gpu = [g for g in spec["rayClusterSpec"]["workerGroupSpecs"] if g["groupName"] == "gpu-group"][0]
    limits = gpu["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == 1  # KubeRay reads the GPU count from limits
    # the run folder outlives the pods: --out is a volume every pod mounts from a ReadWriteMany claim
    assert claim["kind"] == "PersistentVolumeClaim" and claim["spec"]["accessModes"] == ["ReadWriteMany"]
    out = spec["entrypoint"].split("--out ")[1].split()[0]
    groups = [spec["rayClusterSpec"]["headGroupSpec"], *spec["rayClusterSpec"]["workerGroupSpecs"]]
    for group in groups:
        pod = group["template"]["spec"]
        (volume,) = pod["volumes"]
        assert volume["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
        assert {m["mountPath"] for m in pod["containers"][0]["volumeMounts"]} == {out}


def test_launcher_installs_every_no_deps_package():
    pins = [line.strip() for line in (CLUSTER.parent / "requirements-nodeps.txt").read_text().splitlines()
            if line.strip() and not line.startswith("#")]
    setup = " ".join(yaml.safe_load((CLUSTER / "ray-cluster-aws.yaml").read_text())["setup_commands"])
    assert pins and [p for p in pins if p not in setup] == []
    assert "requirements-nodeps.txt" in (CLUSTER / "Dockerfile").read_text()


def _env_before_ray_start(command: str) -> dict[str, str]:
    """The VAR=value assignments a launcher command puts in front of `ray start`."""
    words = command.split("ray start", 1)[0].replace(";", " ").split()
    return dict(w.split("=", 1) for w in words if "=" in w and not w.startswith("-"))


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_head_started_as_the_launcher_says_refuses_unauthenticated_jobs(tmp_path):
    """On a fresh node (clean HOME) with the cluster's token made as the launcher config says, `ray start --head`
    with the launcher's environment turns token auth on: the Jobs API answers 401 without the token, 200 with it."""
    import os
    import shutil
    import signal
    import subprocess
    import sys
    import tempfile
    import time
    import urllib.error
    import urllib.request

    launcher = yaml.safe_load((CLUSTER / "ray-cluster-aws.yaml").read_text())
    assert launcher["file_mounts"]["~/.ray/auth_token"] == "~/.ray/auth_token"
    head_env = _env_before_ray_start(launcher["head_start_ray_commands"][-1])
    assert head_env.get("RAY_AUTH_MODE") == "token"
    assert _env_before_ray_start(launcher["worker_start_ray_commands"][-1]) == head_env
    home = tmp_path / "home"
    home.mkdir()
    ray_cli = str(Path(sys.executable).with_name("ray"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")} | {
        "HOME": str(home), "RAY_USAGE_STATS_ENABLED": "0"}
    subprocess.run([ray_cli, "get-auth-token", "--generate"], env=env, check=True, capture_output=True, timeout=60)
    token = (home / ".ray" / "auth_token").read_text().strip()
    port, dashboard = _free_port(), _free_port()
    # this head's processes carry this path (short: Ray's socket paths must fit 107 bytes): only they are stopped
    temp = Path(tempfile.mkdtemp(prefix="cv-auth-"))
    head = subprocess.Popen([ray_cli, "start", "--head", f"--port={port}", f"--dashboard-port={dashboard}",
                             "--dashboard-host=127.0.0.1", "--num-cpus=1", "--include-dashboard=true",
                             f"--temp-dir={temp}", "--block"], env=env | head_env, stdout=subprocess.DEVNULL,
                            stderr=(tmp_path / "head.log").open("w"))

    def status(headers: dict) -> int:
        request = urllib.request.Request(f"http://127.0.0.1:{dashboard}/api/jobs/", headers=headers)
        try:
            return urllib.request.urlopen(request, timeout=5).status
        except urllib.error.HTTPError as exc:
            return exc.code

    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                anonymous = status({})
                break
            except OSError:
                assert time.monotonic() < deadline and head.poll() is None, (tmp_path / "head.log").read_text()[-2000:]
                time.sleep(1)
        assert anonymous == 401
        assert status({"Authorization": f"Bearer {token}"}) == 200
    finally:
        head.send_signal(signal.SIGTERM)
        try:
            head.wait(timeout=30)
        except subprocess.TimeoutExpired:
            head.kill()
        marker = str(temp)
        for pid in os.listdir("/proc"):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if pid.isdigit() and marker in cmdline and int(pid) != os.getpid():
                os.kill(int(pid), signal.SIGKILL)
        shutil.rmtree(temp, ignore_errors=True)
