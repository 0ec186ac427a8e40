"""The run's Ray: which cluster to join (or an embedded one), connected once when a stage first needs it and
checked to fit the run's workers, and the stage timer that reports to the run's progress actor."""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterator

import ray

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


def cluster_address(cfg: RunConfig, address: str | None) -> tuple[str, str] | None:
    """(address, where it was given) of the cluster to join: --address, else RAY_ADDRESS, else ray.address."""
    for value, source in ((address, "--address"), (os.environ.get("RAY_ADDRESS"), "RAY_ADDRESS"),
                          (cfg.ray.address, "ray.address")):
        if value:
            return value, source
    return None


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
    ray.init(num_cpus=max(os.cpu_count() or 1, need), include_dashboard=cfg.ray.dashboard,
             log_to_driver=False, runtime_env={"env_vars": WORKER_ENV}, **kwargs)
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
        ray.init(num_cpus=os.cpu_count() or 1, include_dashboard=False, log_to_driver=False,
                 runtime_env={"env_vars": WORKER_ENV})
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


class Timer:
    """Wall time per named stage, logged, and reported to the run's progress actor once Ray is up."""

    def __init__(self, progress: Callable[[], Progress | None] = lambda: None) -> None:
        self.seconds: dict[str, float] = {}
        self.progress = progress

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Time the with-block as stage `name`."""
        t0 = time.perf_counter()
        log.info("stage %s ...", name)
        if (p := self.progress()) is not None:
            p.begin(name)
        try:
            yield
        finally:
            self.seconds[name] = round(time.perf_counter() - t0, 3)
            log.info("stage %s done in %.1f s", name, self.seconds[name])
            if (p := self.progress()) is not None:
                p.end(name, self.seconds[name])
