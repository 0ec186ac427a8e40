"""A running command's summary.json refreshed with each stage's progress (engine.driver.live), and `convalue
status` reading it: a plain thread and summaries written by hand, and once through a real command on Ray."""

from __future__ import annotations

import json
import threading
import time

from conftest import tiny_run_config

from convalue.engine.config import config_from_dict
from convalue.engine.driver.command import RunContext, execute
from convalue.engine.driver.live import LivePolicy, LiveProgress
from convalue.engine.report.status_text import format_status
from convalue.engine.store.status import run_status


def test_the_running_summary_is_rewritten_when_the_progress_moves_and_never_after_stop():
    states = [None, {"stages": {"tune": {"done": 0, "total": 4, "seconds": None}}},
              {"stages": {"tune": {"done": 0, "total": 4, "seconds": None}}},  # unchanged: not written again
              RuntimeError("the progress actor is gone"),  # a refresh that fails is skipped, not fatal
              {"stages": {"tune": {"done": 4, "total": 4, "seconds": 9.5}}}]
    written, two = [], threading.Event()

    def snapshot():
        state = states.pop(0) if states else {"stages": {"tune": {"done": 4, "total": 4, "seconds": 9.5}}}
        if isinstance(state, Exception):
            raise state
        return state

    def write(stages):
        written.append(json.loads(json.dumps(stages)))
        if len(written) == 2:
            two.set()

    with LiveProgress(snapshot, write, LivePolicy(every_s=0.01)) as live:
        assert two.wait(timeout=60)
    assert written == [{"tune": {"done": 0, "total": 4, "seconds": None}},
                       {"tune": {"done": 4, "total": 4, "seconds": 9.5}}]
    live.stop()  # again: harmless
    count = len(written)
    assert not live._thread.is_alive() and len(written) == count
    quiet = LiveProgress(snapshot, write, LivePolicy(every_s=0))
    with quiet:
        assert not quiet._thread.is_alive()  # every_s 0: no refreshes at all


def test_status_shows_a_running_stage_so_far_and_a_later_attempt_s_progress(tmp_path):
    progress = {"tune": {"done": 22, "total": 57, "seconds": None}, "finetune": {"done": 0, "total": 60,
                                                                                   "seconds": None}}
    (tmp_path / "summary.json").write_text(json.dumps({"status": "running", "progress": progress}))
    text = format_status(run_status(tmp_path))
    assert "tune: 22 of 57 so far" in text and "finetune: 0 of 60 so far" in text
    (tmp_path / "summary.json").write_text(json.dumps({"status": "complete"}))
    (tmp_path / ".staging").mkdir()
    (tmp_path / ".staging" / "summary.json").write_text(json.dumps({"status": "running", "progress": progress}))
    text = format_status(run_status(tmp_path))
    assert "a later attempt (running; tune 22 of 57 so far, finetune 0 of 60 so far) did not replace" in text


def test_the_driver_logs_the_tuning_s_progress_before_the_reported_fine_tunes():
    """The dispatch's log follows rho_k's tuning (`tune`) as well as the reported fine-tunes (`finetune`): an hour
    of tuning used to pass without a line."""
    from convalue.actors.solver import progress_news

    states = iter([{"tune": (0, 57)}, {"tune": (0, 57)}, {"tune": (3, 57)}, {"tune": (57, 57), "finetune": (2, 60)}])
    seen: dict = {}
    lines = []
    for state in states:
        lines += progress_news(("tune", "finetune"),
                               lambda stages, s=state: {g: s.get(g, (None, None)) for g in stages}, seen)
    assert lines == ["57 fine-tunes (tune), 0 stored; dispatched by the solver actor",
                     "fine-tunes (tune): 3 of 57 done", "fine-tunes (tune): 57 of 57 done",
                     "60 fine-tunes (finetune), 2 stored; dispatched by the solver actor"]


def test_stop_waits_for_a_write_under_way_and_none_follows_it():
    """The final summary is written after stop(): a refresh under way ends first, and none starts after."""
    import itertools

    started, release, written = threading.Event(), threading.Event(), []

    def write(stages):
        written.append(stages)
        started.set()
        release.wait(timeout=60)

    counts = itertools.count()
    live = LiveProgress(lambda: {"stages": {"finetune": {"done": next(counts), "total": 100}}}, write,
                        LivePolicy(every_s=0.01))
    with live:
        assert started.wait(timeout=60)
        stopper = threading.Thread(target=live.stop)
        stopper.start()
        stopper.join(timeout=0.5)
        assert stopper.is_alive()  # blocked behind the write under way
        release.set()
        stopper.join(timeout=60)
        assert not stopper.is_alive()
    assert len(written) == 1 and not live._thread.is_alive()


def test_a_command_s_running_summary_follows_its_progress_actor(ray_session, tiny_model_dir, target_jsonl,
                                                                pool_jsonl, tmp_path):
    """The wiring in execute(): what a stage reports to the run's progress actor reaches the running summary.json
    while the command works (seen by `convalue status`), and the final summary replaces it."""
    cfg = config_from_dict(tiny_run_config(tmp_path, tiny_model_dir, target_jsonl, pool_jsonl, name="live"))
    run_dir = tmp_path / "runs" / "live"
    seen: list[str] = []

    def body(ctx: RunContext) -> None:
        progress = ctx.session.progress
        progress.begin("finetune")
        progress.total("finetune", 60)
        progress.advance("finetune", 22)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not seen:
            if "22 of 60 so far" in (text := format_status(run_status(run_dir))):
                seen.append(text)
            time.sleep(0.05)
        progress.end("finetune", 1.0)

    summary = execute(cfg, "run", lambda cfg: None, lambda cfg, data: None, body, live=LivePolicy(every_s=0.05))
    assert seen and "finetune: 22 of 60 so far" in seen[0], seen
    assert summary.status == "complete"
    assert "so far" not in format_status(run_status(run_dir))
