"""A run's progress on its cluster: a small actor that keeps it, exports it as Ray metrics (Prometheus) and
records where each work item ran, so retries and worker restarts are counted."""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid

import ray
from ray.util.metrics import Counter, Gauge

from convalue.engine.report.bars import Bars

log = logging.getLogger("convalue")

TAGS = ("run", "attempt", "stage")  # attempt: one id per start of a run, so a resumed run does not add to the last
#: on a cluster the actor outlives the driver this long after the run, so a scrape sees the final gauges
LINGER_S = 60.0
# Ray 2.60 drops a gauge from the node's metrics endpoint once it has not been set for two report intervals
# (20 s by default; its metrics agent's gauge TTL), while counters stay, so a stage that runs for minutes would
# vanish from a dashboard: the actor sets its gauges again at this period, below the TTL at any report interval
# (Ray floors the interval at 1 s)
GAUGE_REFRESH_S = 0.5


@ray.remote(num_cpus=0, max_restarts=0)
class ProgressActor:
    """Stage, items done of items to do, tokens, retries and worker restarts of one run; every change is exported
    as a Ray metric (`ray_convalue_*` on each node's metrics endpoint, which Prometheus and the dashboard's Grafana
    read; cluster/grafana/convalue-dashboard.json charts them)."""

    def __init__(self, run: str, attempt: str):
        self.run, self.attempt = run, attempt
        self.done_metric = Counter("convalue_items_done", "Work items finished by a stage (groups featurised, "
                                   "bootstrap resamples, fine-tunes).", tag_keys=TAGS)
        self.total_metric = Gauge("convalue_items_total", "Work items the stage has to finish.", tag_keys=TAGS)
        self.running_metric = Gauge("convalue_stage_running", "1 while the stage runs, else 0.", tag_keys=TAGS)
        self.seconds_metric = Gauge("convalue_stage_seconds", "Wall seconds of the stage, once it ended.",
                                    tag_keys=TAGS)
        self.tokens_metric = Counter("convalue_tokens_featurised", "Tokens featurised by the gradient workers.",
                                     tag_keys=("run", "attempt"))
        self.unfinished_metric = Gauge("convalue_items_unfinished", "Work items a stage ended without (it failed or "
                                       "was stopped); 0 while it runs.", tag_keys=TAGS)
        self.retries_metric = Gauge("convalue_retries", "Work items of the stage that ran again after a failed "
                                    "attempt (each extra attempt counts).", tag_keys=TAGS)
        self.restarts_metric = Gauge("convalue_worker_restarts", "Workers of the stage that came back in a new "
                                     "process.", tag_keys=TAGS)
        self.stages: dict[str, dict] = {}
        self.current: str | None = None
        self.tokens = 0
        self.gauges: dict[tuple[str, str], tuple[object, float]] = {}  # (metric, stage) -> (gauge, value)
        self.attempts: dict[str, dict[str, list[str]]] = {}  # stage -> work item -> where each attempt ran
        self.lock = threading.Lock()
        threading.Thread(target=self._refresh, name="convalue-gauges", daemon=True).start()

    def _tags(self, stage: str) -> dict[str, str]:
        return {"run": self.run, "attempt": self.attempt, "stage": stage}

    def _stage(self, stage: str) -> dict:
        return self.stages.setdefault(stage, {"done": 0, "total": None, "seconds": None})

    def _set(self, gauge, stage: str, value: float) -> None:
        with self.lock:
            self.gauges[(gauge.info["name"], stage)] = (gauge, value)
            gauge.set(value, tags=self._tags(stage))

    def _refresh(self) -> None:
        while True:
            time.sleep(GAUGE_REFRESH_S)
            with self.lock:
                for (_, stage), (gauge, value) in self.gauges.items():
                    gauge.set(value, tags=self._tags(stage))

    def begin(self, stage: str) -> None:
        """The stage starts."""
        self.current = stage
        self._stage(stage)
        self._set(self.running_metric, stage, 1)

    def total(self, stage: str, n: int) -> None:
        """The stage has n items to finish."""
        self._stage(stage)["total"] = n
        self._set(self.total_metric, stage, n)

    def advance(self, stage: str, n: int = 1, tokens: int = 0) -> None:
        """n more items of the stage finished (and `tokens` more tokens featurised)."""
        self._stage(stage)["done"] += n
        if n > 0:
            self.done_metric.inc(n, tags=self._tags(stage))
        if tokens > 0:
            self.tokens += tokens
            self.tokens_metric.inc(tokens, tags={"run": self.run, "attempt": self.attempt})
        self._unfinished(stage)

    def end(self, stage: str, seconds: float) -> None:
        """The stage ended (finished or failed) after `seconds`."""
        self._stage(stage)["seconds"] = seconds
        self._set(self.running_metric, stage, 0)
        self._set(self.seconds_metric, stage, seconds)
        self._unfinished(stage)
        if self.current == stage:
            self.current = None

    def _unfinished(self, stage: str) -> None:
        # computed again on every change: a worker's last advance() can arrive after the driver's end()
        state = self._stage(stage)
        if state["total"] is not None and state["seconds"] is not None:
            self._set(self.unfinished_metric, stage, max(0, state["total"] - state["done"]))

    def linger(self, seconds: float) -> None:
        """Keep exporting the final gauges for `seconds`, then end this actor's process."""
        threading.Timer(seconds, os._exit, (0,)).start()

    def attempt(self, stage: str, item: str, where: str) -> None:
        """A worker started work item `item` of the stage (item None: an actor of the stage started); where:
        `<actor id>:<pid>` or `task:<pid>`."""
        self.attempts.setdefault(stage, {}).setdefault(item or f"start {where}", []).append(where)
        retried, restarts = self._recovery_of(stage)
        self._set(self.retries_metric, stage, sum(retried.values()))
        self._set(self.restarts_metric, stage, restarts)

    def _recovery_of(self, stage: str) -> tuple[dict[str, int], int]:
        """({work item: times it ran again}, worker restarts) of one stage."""
        items = self.attempts.get(stage, {})
        retried = {item: len(places) - 1 for item, places in items.items()
                   if len(places) > 1 and not item.startswith("start ")}
        pids: dict[str, set[str]] = {}
        for places in items.values():
            for where in places:
                actor, _, pid = where.rpartition(":")
                if actor and actor != "task":
                    pids.setdefault(actor, set()).add(pid)
        return retried, sum(len(p) - 1 for p in pids.values())

    def recovery(self) -> dict:
        """Per stage: work items started more than once (retries) and actors that came back in a new process
        (restarts), each with the items concerned."""
        out = {}
        for stage in self.attempts:
            retried, restarts = self._recovery_of(stage)
            if retried or restarts:
                out[stage] = {"retries": sum(retried.values()), "retried": sorted(retried)[:20],
                              "worker_restarts": restarts}
        return out

    def snapshot(self) -> dict:
        """{"stage": the running one or None, "stages": {name: {done, total, seconds}}, "tokens": n}."""
        return {"stage": self.current, "stages": self.stages, "tokens": self.tokens}


class Progress:
    """The driver's handle on its ProgressActor: calls are sent and not waited for (about 0.3 ms each in the
    driver, measured on a local Ray); the actor is named convalue-progress-<run>-<pid>-<6 hex> on the dashboard
    (unique even for the same run name again in one process, before Ray has released the last one's name)."""

    def __init__(self, run: str, detached: bool = False, bars: Bars | None = None):
        self.bars = bars or Bars(enabled=False)
        self.attempt = uuid.uuid4().hex[:12]
        self.detached = detached
        self.name = f"convalue-progress-{run}-{os.getpid()}-{self.attempt[:6]}"
        opts = {"lifetime": "detached"} if detached else {}
        self.actor = ProgressActor.options(name=self.name, **opts).remote(run, self.attempt)

    def begin(self, stage: str) -> None:
        """The stage starts."""
        self.actor.begin.remote(stage)

    def total(self, stage: str, n: int) -> None:
        """The stage has n items to finish."""
        self.actor.total.remote(stage, n)
        self.bars.total(stage, n)

    def advance(self, stage: str, n: int = 1, tokens: int = 0) -> None:
        """n more items of the stage finished."""
        self.actor.advance.remote(stage, n, tokens)
        self.bars.advance(stage, n)

    def end(self, stage: str, seconds: float) -> None:
        """The stage ended after `seconds`."""
        self.actor.end.remote(stage, seconds)
        self.bars.close(stage)

    def recovery(self, timeout: float = 10.0) -> dict:
        """ProgressActor.recovery() ({} if the actor cannot answer)."""
        try:
            return ray.get(self.actor.recovery.remote(), timeout=timeout)
        except (ray.exceptions.GetTimeoutError, ray.exceptions.RayActorError) as exc:
            log.warning("recovery record of the run unavailable: %s", exc)
            return {}

    def snapshot(self, timeout: float = 10.0, quiet: bool = False) -> dict | None:
        """The actor's state once every call sent before has been applied; None (with a warning, or quiet: a debug
        line, for a caller that asks every few seconds) if it cannot answer within `timeout` seconds (say, the
        cluster went away with the run's failure)."""
        try:
            return ray.get(self.actor.snapshot.remote(), timeout=timeout)
        except (ray.exceptions.GetTimeoutError, ray.exceptions.RayActorError) as exc:
            (log.debug if quiet else log.warning)("progress of the run unavailable: %s", exc)
            return None

    def follow(self, stages: tuple[str, ...]) -> dict[str, tuple[int | None, int | None]]:
        """{stage: (done, total)} of stages another worker advances (the fine-tunes a solver actor dispatches),
        read back from one snapshot and shown on each stage's bar."""
        states = (self.snapshot(quiet=True) or {"stages": {}})["stages"]
        now = {}
        for stage in stages:
            state = states.get(stage) or {}
            done, total = now[stage] = state.get("done"), state.get("total")
            if total is not None:
                if stage not in self.bars.bars:
                    self.bars.total(stage, total)
                self.bars.set(stage, done or 0)
        return now

    def close(self, linger_s: float = LINGER_S) -> None:
        """Stop the actor: at once on a cluster this run started (it ends with it), after linger_s on a cluster it
        joined, so the final gauges can be scraped (best effort: a cluster that is gone takes it with it)."""
        try:
            if self.detached:
                self.actor.linger.remote(linger_s)
            else:
                ray.kill(self.actor)
        except Exception as exc:  # called from a run's cleanup: never hide the run's own error behind this one
            log.warning("progress actor not stopped: %s", exc)


def find_progress(name: str | None) -> object | None:
    """The run's progress actor by its name (None where there is none), for an actor's constructor: a handle passed
    there makes Ray keep the constructor's arguments in the object store and warn that a restart could fail."""
    if name is None:
        return None
    try:
        return ray.get_actor(name)
    except ValueError:  # the run ended, or a bench without one
        return None


def report_attempt(progress: object | None, stage: str, item: str | None) -> None:
    """From inside a worker: tell the run's progress actor (a handle, or None) that work item `item` starts here
    (None: this actor starts, so a restart shows as a second process of the same actor)."""
    if progress is None:
        return
    ctx = ray.get_runtime_context()
    actor = ctx.get_actor_id()
    progress.attempt.remote(stage, item, f"{actor or 'task'}:{os.getpid()}")
