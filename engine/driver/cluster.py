"""What the driver checks of a Ray cluster before it gives it work: that a Ray answers at the address it was given
(in seconds: ray.init retries for minutes, and cannot be stopped with Ctrl-C while it does), and that a worker's
request fits on the cluster's largest node (a request no node can hold would wait forever)."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

import grpc
import ray
from ray._private import state
from ray.core.generated import (
    gcs_service_pb2,
    gcs_service_pb2_grpc,
    ray_client_pb2,
    ray_client_pb2_grpc,
)

from convalue.engine.config import ConfigError, RunConfig
from convalue.engine.driver.errors import (
    ClusterError as ClusterError,  # re-exported: callers import it here
)

#: gRPC answers that come from a Ray (the call was refused, not misunderstood): a cluster with token auth answers
#: UNAUTHENTICATED to a probe that sends no token, and ray.init then sends the token it finds
RAY_ANSWERS = (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED)


def check_reachable(addr: str, source: str, timeout: float = 5.0) -> None:
    """Refuse an address where no Ray answers, within about `timeout` seconds: nothing listening, a host that does
    not resolve, or a service that is not Ray (a web server, a dashboard's HTTP port) all end in a ClusterError
    naming the address and where it was given."""
    if addr.startswith(("http://", "https://")):
        raise ClusterError(f"{addr} (given by {source}) is an HTTP address, such as a Ray dashboard's; give the "
                           "cluster's GCS address (HOST:6379 by default, or `auto` on one of its nodes), or submit "
                           "the run to a dashboard with cluster/submit.sh")
    client = addr.startswith("ray://")
    host, sep, port = addr.removeprefix("ray://").rpartition(":")
    if not sep or not host or not port.isdigit():
        return  # `auto`, or another form that Ray resolves itself
    target = f"{host}:{port}"
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as exc:
        raise ClusterError(f"cannot reach a Ray cluster at {addr} (given by {source}): {exc}; start one with "
                           "`ray start --head`, or give no address for an embedded cluster") from None
    problem = _ray_answers(target, client, timeout)
    if problem is not None:
        kind = "a Ray client server (ray://, port 10001 by default)" if client else \
            "a Ray GCS (HOST:6379 by default, the address `ray start --head` prints)"
        raise ClusterError(f"no Ray cluster answers at {addr} (given by {source}): something listens there, but "
                           f"not {kind}: {problem}")


def _ray_answers(target: str, client: bool, timeout: float) -> str | None:
    """None if a Ray GCS (a Ray client server for ray://) answers one call at target, else what went wrong."""
    with grpc.insecure_channel(target) as channel:
        try:
            if client:
                ray_client_pb2_grpc.RayletDriverStub(channel).ClusterInfo(
                    ray_client_pb2.ClusterInfoRequest(type=ray_client_pb2.ClusterInfoType.PING), timeout=timeout)
            else:
                gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel).GetClusterId(
                    gcs_service_pb2.GetClusterIdRequest(), timeout=timeout)
        except grpc.RpcError as exc:
            if exc.code() in RAY_ANSWERS:
                return None
            detail = (exc.details() or "").splitlines()[0][:120] if exc.details() else ""
            return f"{exc.code().name}: {detail}" if detail else exc.code().name
    return None


@dataclass(frozen=True)
class NodeShape:
    """What one node of the cluster offers a worker: its CPUs and GPUs, and how to name it in a message."""

    name: str
    cpus: float
    gpus: float


def this_machine() -> NodeShape:
    """This machine's CPUs (the node an embedded cluster runs on; its GPUs are counted by Ray once it is up)."""
    return NodeShape("this machine", float(os.cpu_count() or 1), 0.0)


def cluster_nodes() -> list[NodeShape]:
    """The connected cluster's live nodes and the node types its autoscaler may start (a cluster whose workers
    scale from zero has none of them yet)."""
    nodes = [NodeShape(f"node {n['NodeManagerAddress']}", n["Resources"].get("CPU", 0.0),
                       n["Resources"].get("GPU", 0.0)) for n in ray.nodes() if n["Alive"]]
    config = state.state.get_cluster_config()  # None without an autoscaler
    for group in config.node_group_configs if config is not None else ():
        if group.max_count != 0:
            cpus, gpus = group.resources.get("CPU", 0), group.resources.get("GPU", 0)
            nodes.append(NodeShape(f"node type {group.name}", cpus, gpus))
    return nodes


def check_fits(cfg: RunConfig, nodes: list[NodeShape], gpus: bool = True) -> None:
    """Refuse ray.cpus_per_worker (and, with gpus, ray.gpus_per_worker) beyond what the largest of `nodes` offers:
    Ray would keep such a worker pending for ever."""
    asks = [("ray.cpus_per_worker", cfg.ray.cpus_per_worker, "cpus", "CPUs")]
    if gpus:
        asks.append(("ray.gpus_per_worker", cfg.ray.gpus_per_worker, "gpus", "GPUs"))
    for field, need, key, unit in asks:
        if need <= 0 or not nodes:
            continue
        largest = max(nodes, key=lambda n: getattr(n, key))
        have = getattr(largest, key)
        if need > have:
            raise ConfigError(f"asks {need:g} {unit} per worker, more than the cluster's largest node has "
                              f"({largest.name}: {have:g} {unit[:-1] if have == 1 else unit})", field=field,
                              value=need)
