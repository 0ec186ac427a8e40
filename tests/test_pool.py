"""The bounded ray.wait window: cost-balanced assignment, completion order, and failures that name their payload."""

from __future__ import annotations

import pytest


def test_window_assigns_by_outstanding_cost_and_names_failures(ray_session):
    import ray

    from convalue.actors.pool import WorkItemError, windowed

    @ray.remote
    class Echo:
        def __init__(self, tag: int):
            self.tag = tag

        def run(self, payload: int) -> tuple[int, int]:
            if payload < 0:
                raise ValueError("negative payload")
            return self.tag, payload

    workers = [Echo.remote(0), Echo.remote(1)]
    payloads = [10, 1, 2, 3]  # one costly item, three cheap ones, all in flight at once
    by_worker: dict[int, list[int]] = {}
    for payload, (tag, echoed) in windowed(workers, payloads, lambda w, p: w.run.remote(p), max_in_flight=4,
                                           cost=float):
        assert echoed == payload
        by_worker.setdefault(tag, []).append(payload)
    assert sorted(by_worker[0]) == [10] and sorted(by_worker[1]) == [1, 2, 3]  # 6 outstanding < 10

    results = list(windowed(workers, list(range(7)), lambda w, p: w.run.remote(p), max_in_flight=2))
    assert sorted(p for p, _ in results) == list(range(7))
    with pytest.raises(WorkItemError, match="work item -1 failed") as failed:
        list(windowed(workers, [3, -1, 4], lambda w, p: w.run.remote(p), max_in_flight=2))
    # the worker's own exception travels with it, for callers that tell input errors from faults
    assert failed.value.what == "-1" and type(failed.value.cause) is ValueError
    assert str(failed.value.cause) == "negative payload"
