"""The run's Ray: which cluster to join (or an embedded one: on loopback only, with token auth and a private token,
quiet), connected once when a stage first needs it and checked to fit the run's workers."""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
from collections.abc import Iterator
from pathlib import Path

import ray
from ray._private import ray_constants
from ray._raylet import Config

from convalue.actors.progress import Progress
from convalue.engine.config import RunConfig
from convalue.engine.driver import signals
from convalue.engine.driver.cluster import (
    ClusterError as ClusterError,  # re-exported: callers import it here
)
from convalue.engine.driver.cluster import check_fits, check_reachable, cluster_nodes, this_machine
from convalue.engine.report.bars import Bars

log = logging.getLogger("convalue")
WORKER_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
AUTH_MODE = "RAY_AUTH_MODE"


def cluster_address(cfg: RunConfig, address: str | None) -> tuple[str, str] | None:
    """(address, where it was given) of the cluster to join: --address, else RAY_ADDRESS, else ray.address."""
    for value, source in ((address, "--address"), (os.environ.get("RAY_ADDRESS"), "RAY_ADDRESS"),
                          (cfg.ray.address, "ray.address")):
        if value:
            return value, source
    return None


def token_path() -> Path:
    """Where Ray reads its auth token: RAY_AUTH_TOKEN_PATH, else ~/.ray/auth_token."""
    return Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or "~/.ray/auth_token").expanduser()


def private_token_auth() -> None:
    """Token auth for an embedded cluster, as Ray 2.60 turns it on for ray.init, but said explicitly (Ray warns when
    it chooses it) and with a token only this user can read: Ray would write ~/.ray/auth_token readable by all
    (0644), so one is made first, 0600. An explicit RAY_AUTH_MODE, and a token that exists, are left as they are."""
    mode = os.environ.get(AUTH_MODE)
    if mode is not None and mode.lower() != "token":
        return
    path = token_path()
    if not os.environ.get("RAY_AUTH_TOKEN") and not (path.is_file() and path.stat().st_size > 0):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            os.fchmod(f.fileno(), 0o600)  # an empty file that was there keeps its mode through O_CREAT
            f.write(secrets.token_hex(32))  # as `ray get-auth-token --generate` makes one
        log.info("made the Ray auth token of embedded clusters: %s (readable by you only)", path)
    if mode is None:
        os.environ[AUTH_MODE] = "token"  # the cluster's processes inherit it
        Config.initialize("")  # Ray reads its config once per process: this one sees token mode too (as Ray does)


@contextlib.contextmanager
def loopback() -> Iterator[None]:
    """Within: a Ray started here takes 127.0.0.1 as its node's address, so its GCS, raylet, workers and agents
    listen on loopback only. Ray 2.60 replaces 127.0.0.1 by the machine's address (for other nodes to join) unless
    its single-machine switch is off (ray_constants.ENABLE_RAY_CLUSTER, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER read at
    import); it is off only while the cluster starts, so a later ray.init(address=...) is unaffected."""
    before = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = before


def start_embedded(num_cpus: int, include_dashboard: bool, **kwargs) -> None:
    """Start a Ray on this machine for this process: bound to loopback, token auth on with a private token, and
    quiet (Ray's own INFO lines, such as "Started a local Ray instance", are not printed; its warnings are)."""
    private_token_auth()
    with loopback():
        # address "local": a Ray of its own, even where `ray start` (or a test's cluster) left a head running here,
        # which ray.init() would join
        ray.init(address="local", num_cpus=num_cpus, include_dashboard=include_dashboard, log_to_driver=False,
                 logging_level=logging.WARNING, _node_ip_address="127.0.0.1", runtime_env={"env_vars": WORKER_ENV},
                 **kwargs)


def connect(cfg: RunConfig, addr: str | None) -> bool:
    """Join the cluster at addr (cluster_address), or start an embedded one; True if this call started Ray."""
    if ray.is_initialized():
        return False
    if addr:
        # an existing cluster (or a Ray job's driver) owns the runtime env: passing one here conflicts
        # with the job's ("Failed to merge the Job's runtime env"); cluster/submit.sh sets HF_HUB_OFFLINE
        ray.init(address=addr)
        return True
    check_fits(cfg, [this_machine()], gpus=False)  # its node is this machine (the logical CPUs are raised below)
    need = cfg.ray.workers * cfg.ray.cpus_per_worker
    kwargs = {}
    if cfg.ray.object_store_memory_mb:
        kwargs["object_store_memory"] = cfg.ray.object_store_memory_mb * 2**20
    start_embedded(max(os.cpu_count() or 1, need), cfg.ray.dashboard, **kwargs)
    return True


def connect_default() -> bool:
    """Join RAY_ADDRESS's cluster, or start an embedded one sized to this machine (for commands without a run
    config, such as `convalue score`); True if this call started Ray."""
    if ray.is_initialized():
        return False
    if address := os.environ.get("RAY_ADDRESS"):
        check_reachable(address, "RAY_ADDRESS")
        ray.init(address=address)
    else:
        start_embedded(os.cpu_count() or 1, include_dashboard=False)
    signals.install()
    return True


class RaySession:
    """The run's Ray: connected once, when a stage first needs it; shut down at the end only if the run started it."""

    def __init__(self, cfg: RunConfig, addr: str | None):
        self.cfg, self.addr, self.connected, self.started = cfg, addr, False, False
        self.progress: Progress | None = None

    def up(self) -> None:
        """Connect (or start an embedded Ray) unless already done, and start the run's progress actor."""
        if not self.connected:
            self.started, self.connected = connect(self.cfg, self.addr), True
            signals.install()  # ray.init installs its own SIGTERM handler (sys.exit), which records no signal
            check_fits(self.cfg, cluster_nodes())  # before any work is given to a worker no node can hold
            # on a cluster joined by address, the progress actor outlives the driver briefly (for a final scrape)
            self.progress = Progress(self.cfg.name, detached=self.addr is not None, bars=Bars())

    def close(self) -> None:
        """Stop the progress actor; shut down a Ray this run started."""
        if self.progress is not None:
            self.progress.close()
        if self.started:
            ray.shutdown()
