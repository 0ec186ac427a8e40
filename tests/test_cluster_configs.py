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
    job = yaml.safe_load((CLUSTER / "rayjob.yaml").read_text())
    assert job["apiVersion"] == "ray.io/v1" and job["kind"] == "RayJob"
    spec = job["spec"]
    assert spec["entrypoint"].startswith("convalue run ")
    assert spec["rayClusterSpec"]["rayVersion"] == "2.60.0"
    gpu = [g for g in spec["rayClusterSpec"]["workerGroupSpecs"] if g["groupName"] == "gpu-group"][0]
    limits = gpu["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == 1  # KubeRay reads the GPU count from limits


def test_launcher_installs_every_no_deps_package():
    pins = [line.strip() for line in (CLUSTER.parent / "requirements-nodeps.txt").read_text().splitlines()
            if line.strip() and not line.startswith("#")]
    setup = " ".join(yaml.safe_load((CLUSTER / "ray-cluster-aws.yaml").read_text())["setup_commands"])
    assert pins and [p for p in pins if p not in setup] == []
    assert "requirements-nodeps.txt" in (CLUSTER / "Dockerfile").read_text()
