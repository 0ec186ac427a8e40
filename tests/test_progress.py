"""The run's progress actor: its state, and the Ray metrics it exports (read from the node's metrics endpoint)."""

from __future__ import annotations

import re
import time
import urllib.request

from convalue.actors.progress import Progress


def _scrape(ray, names: list[str], run: str, timeout: float = 45.0) -> dict[str, float]:
    """{metric name: value} of this run's `names` on the node's Prometheus endpoint, once all are exported
    (Ray exports every few seconds)."""
    port = ray.nodes()[0]["MetricsExportPort"]
    found: dict[str, float] = {}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        for line in text.splitlines():
            m = re.match(r"^(ray_convalue_\w+)\{(.*)\} (\S+)$", line)
            if m and f'run="{run}"' in m[2] and m[1] in names:
                stage = re.search(r'stage="(\w+)"', m[2])
                found[m[1] + (f":{stage[1]}" if stage else "")] = float(m[3])
        if all(any(k.split(":")[0] == n for k in found) for n in names):
            return found
        time.sleep(1.0)
    return found


def test_progress_keeps_each_stage_and_exports_it_as_ray_metrics(ray_session):
    progress = Progress("t-progress")
    try:
        progress.begin("featurize")
        progress.total("featurize", 10)
        progress.advance("featurize", 4, tokens=300)
        progress.advance("featurize", 3, tokens=200)
        progress.end("featurize", 1.5)
        progress.begin("finetune")
        progress.total("finetune", 2)
        progress.advance("finetune")
        snap = progress.snapshot()
        assert snap == {"stage": "finetune", "tokens": 500,
                        "stages": {"featurize": {"done": 7, "total": 10, "seconds": 1.5},
                                   "finetune": {"done": 1, "total": 2, "seconds": None}}}
        # the fine-tunes a solver actor dispatches are followed stage by stage from that one state
        assert progress.follow(("finetune", "tune")) == {"finetune": (1, 2), "tune": (None, None)}
        found = _scrape(ray_session, ["ray_convalue_items_done_total", "ray_convalue_items_total",
                                      "ray_convalue_stage_running", "ray_convalue_stage_seconds",
                                      "ray_convalue_tokens_featurised_total"], "t-progress")
        assert found["ray_convalue_items_done_total:featurize"] == 7
        assert found["ray_convalue_items_total:featurize"] == 10
        assert found["ray_convalue_items_done_total:finetune"] == 1
        assert found["ray_convalue_stage_running:featurize"] == 0 and found["ray_convalue_stage_running:finetune"] == 1
        assert found["ray_convalue_stage_seconds:featurize"] == 1.5
        assert found["ray_convalue_tokens_featurised_total"] == 500
        # nothing reported for longer than Ray keeps a gauge that is not set again (two report intervals: 2 s
        # here, 20 s by default): the gauges are still exported, since the actor sets them again
        time.sleep(5.0)
        again = _scrape(ray_session, ["ray_convalue_items_total", "ray_convalue_stage_running",
                                      "ray_convalue_stage_seconds"], "t-progress", timeout=10.0)
        assert again["ray_convalue_items_total:featurize"] == 10 and again["ray_convalue_stage_running:finetune"] == 1
        assert again["ray_convalue_stage_seconds:featurize"] == 1.5
    finally:
        progress.close()
    # a stopped actor: a warning, not a hang. ray.kill is asynchronous, so a call sent just after it can still
    # be answered on a busy host (seen once under two pytest workers); the actor must be gone within seconds
    deadline = time.monotonic() + 30.0
    while (late := progress.snapshot(timeout=5)) is not None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert late is None


def test_each_start_of_a_run_has_its_own_attempt_tag_and_a_detached_actor_lingers(ray_session):
    """A resumed run reuses its name: its metrics carry a new `attempt`, so sums per (run, attempt) do not mix the
    two starts; on a joined cluster the actor outlives close() for a while, then ends."""
    first, second = Progress("t-resume"), Progress("t-resume", detached=True)
    assert first.attempt != second.attempt
    try:
        first.total("featurize", 9)
        first.advance("featurize", 9)
        second.total("featurize", 9)
        second.advance("featurize", 6)
        port = ray_session.nodes()[0]["MetricsExportPort"]
        series: dict[str, float] = {}
        deadline = time.monotonic() + 45.0
        while len(series) < 2 and time.monotonic() < deadline:
            text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
            for line in text.splitlines():
                m = re.match(r'^ray_convalue_items_done_total\{(.*)\} (\S+)$', line)
                if m and 'run="t-resume"' in m[1]:
                    series[re.search(r'attempt="(\w+)"', m[1])[1]] = float(m[2])
            time.sleep(1.0)
        assert series == {first.attempt: 9.0, second.attempt: 6.0}
    finally:
        first.close()
        second.close(linger_s=3.0)
    assert second.snapshot(timeout=5) is not None  # still there after close: its gauges can be scraped
    deadline = time.monotonic() + 30.0
    while (late := second.snapshot(timeout=5)) is not None and time.monotonic() < deadline:
        time.sleep(0.5)
    assert late is None


def test_a_gradient_worker_is_made_with_the_progress_actors_name_not_its_handle(ray_session, capfd):
    """A handle among an actor's constructor arguments made Ray keep them in the object store and warn, once per
    gradient worker in every job log, that a restart could fail; the workers get the progress actor's name and
    look it up themselves (a restart is still counted: tests/test_faults.py)."""
    import ray

    from convalue.actors.progress import find_progress

    @ray.remote(max_restarts=1)
    class Probe:
        def __init__(self, progress: str | None):
            self.found = find_progress(progress) is not None

        def found_it(self) -> bool:
            return self.found

    progress = Progress("t-by-name")
    try:
        assert ray.get(Probe.remote(progress.name).found_it.remote())
        assert not ray.get(Probe.remote(None).found_it.remote())
        assert not ray.get(Probe.remote("convalue-progress-no-such-run").found_it.remote())
        assert "constructor arguments in the object store" not in capfd.readouterr().err
    finally:
        progress.close()
