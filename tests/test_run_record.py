"""The run record: a finished run survives a re-run that fails, is interrupted by a real signal or killed, or
names an unreachable cluster (byte-identical results, `status` exit 0); `status` calls any promised artifact that
is missing damaged (exit 1); `list` lists good runs beside a broken one, names escaped."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import own_copy, snapshot

from convalue.engine.driver.cli import main
from convalue.engine.files.folder import RunFolder
from convalue.engine.store.record import RunRecord
from convalue.engine.store.stage_records import EndRecord, StartRecord, assemble
from convalue.engine.store.status import run_status

CONVALUE = [sys.executable, "-m", "convalue"]



def config_file(first_run, tmp_path: Path, **over) -> Path:
    """The first run's config, writing under tmp_path/runs (its run folder a copy of the first run's)."""
    _, data, _ = first_run
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(data | {"out": str(tmp_path / "runs")} | over))
    return path


def wait_for(path: Path, proc: subprocess.Popen, timeout: float = 600) -> None:
    """Wait until `path` exists (the attempt has begun), failing if the process ends first."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, f"the run ended before {path.name} appeared: {proc.communicate()}"
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.2)


def test_a_rerun_at_an_unreachable_address_leaves_the_finished_run(first_run, tmp_path):
    run_dir = own_copy(first_run, tmp_path / "runs" / "t")
    before = snapshot(run_dir)
    r = subprocess.run([*CONVALUE, "run", str(config_file(first_run, tmp_path)), "--overwrite", "--address",
                        "127.0.0.1:9"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert snapshot(run_dir) == before
    assert main(["status", str(run_dir)]) == 0


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGKILL, -9)])
def test_an_interrupted_or_killed_rerun_leaves_the_finished_run(first_run, tmp_path, sig, code, capsys):
    """A re-run with --overwrite and other settings (its vectors staged) stopped by a real signal once it has
    begun: the complete run stays byte-identical and `status` says complete (exit 0), naming the later attempt."""
    run_dir = own_copy(first_run, tmp_path / "runs" / "t")
    before = snapshot(run_dir)
    projection = first_run[1]["projection"] | {"seed": 7}  # other settings: --overwrite replaces the vectors
    cfg = config_file(first_run, tmp_path, projection=projection)
    proc = subprocess.Popen([*CONVALUE, "run", str(cfg), "--overwrite"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        wait_for(run_dir / ".staging" / "summary.json", proc)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == code and "Traceback" not in err
    assert snapshot(run_dir) == before
    assert main(["status", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert f"{run_dir}: complete" in out
    if sig == signal.SIGINT:
        assert "a later attempt (failed" in out and "did not replace these results" in out


def test_a_rerun_that_completes_replaces_the_results_and_leaves_no_staging(first_run, tmp_path):
    from convalue.engine.config import config_from_dict
    from convalue.engine.driver.pipeline import run

    _, data, first = first_run
    run_dir = own_copy(first_run, tmp_path / "runs" / "t")
    (run_dir / "transfer.png").write_bytes(b"an analysis's figure from before")  # not this run's: removed
    summary = run(config_from_dict(data | {"out": str(tmp_path / "runs")}))
    assert summary.status == "complete" and summary.selected == first.selected
    assert not (run_dir / ".staging").exists() and not (run_dir / "transfer.png").exists()
    status = run_status(run_dir)
    assert status.state == "complete" and status.problems == [], status.problems
    assert set(summary.artifacts) >= {"scores.parquet", "gram.npy", "beta.npy", "scores.png", "examples.parquet"}


def test_every_promised_artifact_is_checked(first_run, tmp_path):
    """Deleting any artifact the summary lists, the vectors' manifest or a field of summary.json makes the
    folder damaged (exit 1), the problem named."""
    _, _, first = first_run
    assert len(first.artifacts) >= 5
    for name in [*first.artifacts, "vectors/manifest.json"]:
        run_dir = own_copy(first_run, tmp_path / name.replace("/", "-"))
        (run_dir / name).unlink()
        status = run_status(run_dir)
        assert status.state == "damaged" and status.exit_code == 1, name
        assert any(name in p for p in status.problems), (name, status.problems)
    run_dir = own_copy(first_run, tmp_path / "cut")
    (run_dir / "summary.json").write_text(json.dumps({"status": "complete"}))
    status = run_status(run_dir)
    assert status.state == "damaged" and "lacks `config`" in status.problems[0]
    run_dir = own_copy(first_run, tmp_path / "flipped")
    data = bytearray((run_dir / "scores.parquet").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (run_dir / "scores.parquet").write_bytes(bytes(data))
    assert run_status(run_dir).state == "damaged" and run_status(run_dir, quick=True).state == "complete"


def test_list_lists_good_runs_beside_broken_ones_with_names_escaped(first_run, tmp_path, capsys):
    runs = tmp_path / "runs"
    own_copy(first_run, runs / "good")
    bad = own_copy(first_run, runs / "no-config")
    summary = json.loads((bad / "summary.json").read_text())
    del summary["config"]
    (bad / "summary.json").write_text(json.dumps(summary))
    forged = own_copy(first_run, runs / "x\ny                    complete")
    (runs / "garbage").mkdir()
    (runs / "garbage" / "summary.json").write_text("[1, 2")
    assert main(["list", str(runs)]) == 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert "Traceback" not in err and len(lines) == 5, out  # the header and one line per run folder
    rows = {line.split()[0]: line.split()[1] for line in lines[1:]}
    assert rows == {"garbage": "damaged", "good": "complete", "no-config": "damaged", "x\\ny": "complete"}, rows
    assert forged.exists()


def test_a_first_attempt_that_fails_is_moved_in_and_says_so(tmp_path):
    """Without a complete run to keep, a failed attempt's summary and partial results are the folder's own."""
    record = RunRecord(RunFolder.open(tmp_path / "r"))
    record.open()
    start = StartRecord(config={"name": "r"}, packages={})
    record.begin(assemble([start, EndRecord(status="running")]))
    assert json.loads((tmp_path / "r" / "summary.json").read_text())["status"] == "running"
    record.write_bytes("scores.png", b"\x89PNG partial")
    where = record.finish(assemble([start, EndRecord(status="failed", error="RuntimeError: boom")]))
    assert where.local == tmp_path / "r" and not (tmp_path / "r" / ".staging").exists()
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["artifacts"]["scores.png"]["bytes"] == 12
    assert run_status(tmp_path / "r").state == "failed"


def test_one_stage_owns_each_summary_field():
    start = StartRecord(config={}, packages={})
    with pytest.raises(ValueError, match="'status' set by both EndRecord and EndRecord"):
        assemble([start, EndRecord(status="running"), EndRecord(status="complete")])
