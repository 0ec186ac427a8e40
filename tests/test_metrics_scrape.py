"""The Grafana dashboard in cluster/grafana against a real scrape: a run on a Ray head started with a metrics
export port, whose Prometheus endpoint is read over HTTP the way Prometheus reads it; every metric the dashboard's
queries name is there, with the values the run's summary.json reports. Also the cluster's refusal of a worker
larger than any of its nodes."""

from __future__ import annotations

import json
import re
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import start_local_ray, tiny_run_config
from run_helpers import ray_head, run_convalue, write_config

from convalue.engine.driver.cluster import check_reachable

pytestmark = pytest.mark.heavy  # whole runs: scheduled before the light modules (conftest.py)

DASHBOARD = Path(__file__).resolve().parents[1] / "cluster" / "grafana" / "convalue-dashboard.json"
SERIES = re.compile(r"^(ray_convalue_\w+)\{(.*)\} (\S+)$")
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def panel_queries(board: dict) -> list[str]:
    """The PromQL query of every panel's targets (those inside rows included)."""
    panels = [p for top in board["panels"] for p in (top, *top.get("panels", []))]
    return [t["expr"] for p in panels for t in p.get("targets", [])]


def variable_queries(board: dict) -> list[str]:
    """The queries that list the dashboard variables' values."""
    return [v["definition"] for v in board["templating"]["list"] if "definition" in v]


def dashboard_metrics() -> set[str]:
    """The convalue metrics the dashboard's queries name."""
    board = json.loads(DASHBOARD.read_text())
    return {m for q in panel_queries(board) + variable_queries(board) for m in re.findall(r"ray_convalue_\w+", q)}


def scrape(endpoints: list[str], run: str, attempt: str) -> dict[tuple[str, str | None], float]:
    """{(metric, stage or None): value} of one run's attempt, summed over the nodes' endpoints (as PromQL's sum)."""
    found: dict[tuple[str, str | None], float] = {}
    for url in endpoints:
        for line in urllib.request.urlopen(url, timeout=10).read().decode().splitlines():
            if (m := SERIES.match(line)) is None:
                continue
            labels = dict(LABEL.findall(m[2]))
            if labels.get("run") == run and labels.get("attempt") == attempt:
                key = (m[1], labels.get("stage"))
                found[key] = found.get(key, 0.0) + float(m[3])
    return found


def test_the_dashboard_is_a_ray_grafana_dashboard_over_convalues_metrics():
    """Importable where Ray's own dashboards go: Ray 2.60's layout, the `${datasource}` variable on every panel,
    queries filtered by run and attempt, and only metrics the progress actor exports."""
    board = json.loads(DASHBOARD.read_text())
    assert board["uid"] == "convalue" and board["title"] == "convalue"
    names = [v["name"] for v in board["templating"]["list"]]
    assert names[0] == "datasource" and board["templating"]["list"][0] == {
        **board["templating"]["list"][0], "type": "datasource", "query": "prometheus"}
    assert {"run", "attempt", "SessionName"} <= set(names)
    panels = [p for top in board["panels"] for p in (top, *top.get("panels", [])) if p["type"] != "row"]
    assert len(panels) >= 8 and all(p["datasource"] == "${datasource}" for p in panels)
    assert len(variable_queries(board)) == 4  # Cluster, SessionName, run, attempt
    for query in panel_queries(board):
        assert 'run=~"$run"' in query and 'attempt=~"$attempt"' in query and "{global_filters}" not in query
    source = (Path(__file__).resolve().parents[1] / "actors" / "progress.py").read_text()
    exported = {f"ray_{name}" + ("_total" if kind == "Counter" else "")
                for kind, name in re.findall(r'(Counter|Gauge)\("(convalue_\w+)"', source)}
    assert dashboard_metrics() == exported  # every metric charted, none that is not exported


@pytest.fixture(scope="module")
def head(tmp_path_factory):
    """A Ray head of this module's own (this process's local Ray yields to it and comes back afterwards)."""
    import ray

    restart = ray.is_initialized()
    if restart:
        ray.shutdown()
    with ray_head(tmp_path_factory.mktemp("head") / "head.log") as h:
        yield h
    if restart:
        start_local_ray()


def test_a_run_on_a_head_exports_every_metric_the_dashboard_charts_with_the_runs_values(
        head, tiny_model_dir, pool_jsonl, target_jsonl, tmp_path):
    import ray

    from convalue.engine.config import config_from_dict
    from convalue.engine.driver.pipeline import run

    data = tiny_run_config(tmp_path, tiny_model_dir, target_jsonl, pool_jsonl, name="t-metrics",
                           finetune={"enabled": True, "steps": 2, "batch_size": 2, "ks": [1],
                                     "baselines": ["target_only"]})
    check_reachable(head.address, "the test")  # a head that went away fails here, not in ray.init's retries
    ray.init(address=head.address, log_to_driver=False)
    try:
        # where Prometheus finds the metrics: each live node's address and metrics export port
        nodes = [n for n in ray.nodes() if n["Alive"]]
        assert [n["MetricsExportPort"] for n in nodes] == [head.metrics_port]
        endpoints = [f"http://{n['NodeManagerAddress']}:{n['MetricsExportPort']}/metrics" for n in nodes]
        run(config_from_dict(data), address=head.address)
    finally:
        ray.shutdown()
    # the run is over: on a cluster it joined, its progress actor keeps exporting the final values for a while
    summary = json.loads((tmp_path / "runs" / "t-metrics" / "summary.json").read_text())
    assert summary["status"] == "complete" and not summary.get("recovered")
    wanted = dashboard_metrics()

    def settled(found: dict) -> bool:
        """Every charted metric is there with the run's final counts: Ray's agent exports on its own schedule, so
        a scrape can see a metric before its last update."""
        return all(found.get(("ray_convalue_items_done_total", stage)) == found.get(("ray_convalue_items_total", stage))
                   and found.get(("ray_convalue_items_unfinished", stage)) == 0 for stage in ("featurize", "finetune"))

    deadline = time.monotonic() + 60
    while True:
        found = scrape(endpoints, "t-metrics", summary["attempt"])
        missing = wanted - {metric for metric, _ in found}
        if not missing and settled(found):
            break
        assert time.monotonic() < deadline, f"not exported: {sorted(missing)}" if missing else f"stale: {found}"
        time.sleep(1.0)

    groups = summary["featurize"]["groups_computed"] + summary["featurize"]["groups_reused"]
    finetunes = len(summary["finetune"])  # here every protocol cell is a fine-tune of its own (KMM k=1, target only)
    assert groups == 5 and finetunes == 2 and summary["featurize"]["tokens"] > 0
    assert found[("ray_convalue_items_done_total", "featurize")] == found[("ray_convalue_items_total", "featurize")] \
        == groups
    assert found[("ray_convalue_tokens_featurised_total", None)] == summary["featurize"]["tokens"]
    assert found[("ray_convalue_items_done_total", "finetune")] == found[("ray_convalue_items_total", "finetune")] \
        == finetunes
    for stage in ("featurize", "finetune"):  # the stages whose workers report each work item they start
        assert found[("ray_convalue_items_unfinished", stage)] == 0
        assert found[("ray_convalue_retries", stage)] == 0 and found[("ray_convalue_worker_restarts", stage)] == 0
    timed = {stage for metric, stage in found if metric == "ray_convalue_stage_seconds"}
    assert {"featurize", "gram", "solve", "finetune"} <= timed
    for stage in timed:
        assert found[("ray_convalue_stage_seconds", stage)] == pytest.approx(summary["timings_s"][stage], abs=1e-3)
        assert found[("ray_convalue_stage_running", stage)] == 0
    assert summary["progress"]["featurize"] == {"done": groups, "total": groups,
                                                "seconds": summary["timings_s"]["featurize"]}


def test_a_worker_larger_than_any_node_of_the_cluster_is_refused_once_joined(head, tiny_model_dir, pool_jsonl,
                                                                             target_jsonl, tmp_path):
    """ray.cpus_per_worker beyond the largest node (here the head's 4 CPUs): one line naming the field and that
    node, exit 2, before any work; Ray itself would keep the workers pending for ever."""
    config = write_config(tmp_path / "run.yaml", tiny_run_config(
        tmp_path, tiny_model_dir, target_jsonl, pool_jsonl, ray={"cpus_per_worker": 1000}))
    done = run_convalue(["run", str(config), "--address", head.address], timeout=300)
    assert done.returncode == 2, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"convalue: error: {config}: ray.cpus_per_worker: asks 1000 CPUs per worker, more than "
                           "the cluster's largest node has (node "), last
    assert last.endswith(": 4 CPUs) (got 1000)") and "Traceback" not in done.stderr
    summary = json.loads((tmp_path / "runs" / "t" / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["failed_stage"] == "ray_init" and not summary.get("featurize")
