"""Faults an operator meets, injected for real: signals sent to a running `convalue run`, files this process may
not read or write, a model whose weights changed, a damaged vector block, a gradient worker killed mid-run."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml
from conftest import chatterbot_pairs, forget_checksum, own_copy, tiny_run_config, write_jsonl

from convalue.engine.config import ConfigError, config_from_dict
from convalue.engine.driver.pipeline import run
from convalue.engine.driver.resolve import resolve
from convalue.engine.store.status import run_status
from convalue.engine.store.vectors import StoreError

pytestmark = pytest.mark.heavy  # whole runs: scheduled before the light modules (conftest.py)

CONVALUE = [sys.executable, "-m", "convalue"]
#: fine-tunes long enough to interrupt
FINETUNE = {"enabled": True, "steps": 60, "batch_size": 2, "ks": [1, 2]}
LANGUAGES = ("english", "spanish", "german", "hindi", "italian", "persian", "marathi")


def _config_file(tmp_path: Path, model_dir: Path, **over) -> Path:
    """A run config on disk: a Marathi target, five chatterbot languages, fine-tunes long enough to interrupt."""
    rows = [r | {"group": lang} for lang in LANGUAGES[:5] for r in chatterbot_pairs(lang, 6)]
    pool = write_jsonl(tmp_path / "pool.jsonl", rows)
    target = write_jsonl(tmp_path / "marathi.jsonl", chatterbot_pairs("marathi", 12))
    data = tiny_run_config(tmp_path, model_dir, target, pool, finetune=FINETUNE, **over)
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def stored_vectors(first_run, run_dir: Path) -> Path:
    """run_dir holding the first run's vector store and nothing else: a run with its model and data reuses every
    group's vector (no gradient worker starts), and the folder holds no complete run, so a failed attempt's summary
    is moved in."""
    shutil.copytree(first_run[0] / "runs" / "t" / "vectors", run_dir / "vectors")
    return run_dir


@pytest.mark.parametrize("sig, when, code", [(signal.SIGTERM, "stage featurize", 143),
                                             (signal.SIGINT, "dispatched by the solver actor", 130)])
def test_a_signal_ends_the_run_with_its_exit_code_and_is_recorded(tiny_model_dir, tmp_path, sig, when, code,
                                                                 request):
    """SIGTERM and SIGINT (twice, as an impatient operator sends them) end `convalue run` with 128 + the signal's
    number, no traceback, and summary.json failed in the stage it stopped, naming the signal. SIGINT comes in the
    fine-tune stage: the run folder holds the first run's vectors, so the run gets there without featurising."""
    if sig == signal.SIGTERM:
        cfg = _config_file(tmp_path, tiny_model_dir)
    else:
        first_run = request.getfixturevalue("first_run")
        stored_vectors(first_run, tmp_path / "runs" / "t")
        cfg = tmp_path / "run.yaml"
        cfg.write_text(yaml.safe_dump(first_run[1] | {"out": str(tmp_path / "runs"), "finetune": FINETUNE}))
    proc = subprocess.Popen([*CONVALUE, "run", str(cfg)], stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                            text=True)
    lines: list[str] = []
    seen = threading.Event()

    def read() -> None:
        for line in proc.stderr:
            lines.append(line)
            if when in line:
                seen.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    assert seen.wait(timeout=240), "".join(lines[-20:])
    proc.send_signal(sig)
    time.sleep(0.5)
    proc.send_signal(sig)  # the second one, while the run cleans up, is ignored
    assert proc.wait(timeout=120) == code, "".join(lines[-20:])
    reader.join(timeout=10)
    err = "".join(lines)
    assert "Traceback" not in err and f"stopped by {sig.name}" in err
    summary = json.loads((tmp_path / "runs" / "t" / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["signal"] == sig.name
    assert summary["failed_stage"] == ("featurize" if sig == signal.SIGTERM else "finetune")
    if sig == signal.SIGINT:  # every vector read back: no gradient worker started
        assert summary["featurize"]["groups_computed"] == 0, summary["featurize"]


def _without_file_permission_override(*args: str) -> list[str]:
    """args run as root without CAP_DAC_OVERRIDE, so file permission bits apply (root ignores them otherwise)."""
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is not installed")
    if os.geteuid() != 0:
        return list(args)
    caps = "-dac_override,-dac_read_search"
    return ["setpriv", f"--inh-caps={caps}", f"--bounding-set={caps}", *args]


def test_unreadable_data_and_unwritable_out_are_clear_errors_before_the_model(tiny_model_dir, tmp_path):
    cfg = _config_file(tmp_path, tiny_model_dir)
    data = yaml.safe_load(cfg.read_text())
    (tmp_path / "pool.jsonl").chmod(0)
    r = subprocess.run(_without_file_permission_override(*CONVALUE, "run", str(cfg)), capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert "data.candidates[0].path: cannot be read by this process (permission denied" in r.stderr
    assert "stage model" not in r.stderr  # refused while the config is read
    (tmp_path / "pool.jsonl").chmod(0o644)
    out = tmp_path / "locked"
    out.mkdir(mode=0o555)
    cfg.write_text(yaml.safe_dump(data | {"out": str(out)}))
    r = subprocess.run(_without_file_permission_override(*CONVALUE, "run", str(cfg)), capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2 and "out: cannot be written by this process" in r.stderr, r.stderr[-2000:]


def test_a_read_only_run_folder_is_refused_by_solve(first_run, tmp_path):
    run_dir = own_copy(first_run, tmp_path / "ro")
    run_dir.chmod(0o555)
    try:
        r = subprocess.run(_without_file_permission_override(*CONVALUE, "solve", str(run_dir), "--gamma", "0.02"),
                           capture_output=True, text=True, timeout=120)
    finally:
        run_dir.chmod(0o755)
    assert r.returncode == 2 and "cannot be written by this process" in r.stderr and "Traceback" not in r.stderr


def test_a_damaged_block_is_reported_set_aside_and_recomputed(first_run, tmp_path, capsys):
    from convalue.engine.driver.cli import main

    _, data, _ = first_run
    run_dir = own_copy(first_run, tmp_path / "runs" / "t")
    block = sorted((run_dir / "vectors").glob("block-*.parquet"))[0]
    raw = bytearray(block.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    block.write_bytes(bytes(raw))
    status = run_status(run_dir)
    assert status.state == "damaged" and block.name in status.vectors.damaged[0]
    assert run_status(run_dir, quick=True).state == "complete"  # --quick does not hash
    assert main(["status", str(run_dir)]) == 1
    assert f"{block}: checksum mismatch" in capsys.readouterr().out
    again = run(config_from_dict(data | {"out": str(tmp_path / "runs"), "finetune": {"enabled": False}}))
    assert again.recovered["vectors"]["blocks_set_aside"] == [block.name]
    assert (run_dir / "vectors" / "damaged" / block.name).is_file() and again.featurize["groups_computed"] >= 1
    assert run_status(run_dir).state == "complete" and run_status(run_dir).vectors.damaged == []


def test_a_changed_model_is_refused_then_recomputed_and_a_killed_gradient_worker_changes_no_score(
        ray_session, tiny_model_dir, tmp_path):
    """Two faults of the vector store's making, sharing their runs (each run starts its gradient workers afresh):
    weights overwritten in place make the stored vectors the old model's, so the rerun refuses them (naming the
    model's digest) and --overwrite computes every group again; then a gradient worker's process SIGKILLed while
    blocks are in flight is restarted by Ray, its calls retried, the run records the restart, and the scores equal
    those of that undisturbed --overwrite run."""
    import ray
    import torch
    from transformers import LlamaForCausalLM

    model_dir = Path(shutil.copytree(tiny_model_dir, tmp_path / "model"))
    rows = [r | {"group": f"{lang}-{i}"} for lang in LANGUAGES[:6] for i in range(2)
            for r in chatterbot_pairs(lang, 12)[6 * i:6 * i + 6]]
    pool = write_jsonl(tmp_path / "pool.jsonl", rows)
    target = write_jsonl(tmp_path / "marathi.jsonl", chatterbot_pairs("marathi", 12))
    base = tiny_run_config(tmp_path, model_dir, target, pool, ray={"workers": 2, "groups_per_call": 1})
    # the undisturbed runs on one worker: each group's vector is made alone, the same bits in any worker
    clean = config_from_dict(base | {"name": "clean", "ray": base["ray"] | {"workers": 1}})
    first = run(clean)
    torch.manual_seed(1)
    LlamaForCausalLM(LlamaForCausalLM.config_class.from_pretrained(model_dir)).save_pretrained(model_dir)
    with pytest.raises(StoreError, match=r"other settings \(differs in \['model_digest'\]\)"):
        run(clean)
    again = run(clean, overwrite=True)
    assert again.featurize["groups_computed"] == len(first.order) + 1 and again.featurize["groups_reused"] == 0
    assert again.model["digest"] != first.model["digest"]
    killed: list[int] = []

    def kill_a_worker() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not killed:
            for name in ray.util.list_named_actors():
                if name.startswith("convalue-grad-0-"):
                    try:
                        pid = ray.get(ray.get_actor(name).info.remote(), timeout=30)["pid"]
                    except Exception:
                        continue
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                    return
            time.sleep(0.05)

    killer = threading.Thread(target=kill_a_worker, daemon=True)
    killer.start()
    hurt = run(config_from_dict(base | {"name": "hurt"}))
    killer.join(timeout=60)
    assert killed, "no gradient worker was found to kill"
    assert hurt.recovered["featurize"]["worker_restarts"] >= 1
    scores = {n: pq.read_table(tmp_path / "runs" / n / "scores.parquet").to_pylist() for n in ("clean", "hurt")}
    exact = ("group", "n_examples", "n_preview", "rank", "selected")  # the same vectors: the same certified answer
    assert [{c: r[c] for c in exact} for r in scores["hurt"]] == [{c: r[c] for c in exact} for r in scores["clean"]]
    for column in ("score", "beta", "cosine"):  # to round-off: the retried blocks may reach the Gram in another order
        np.testing.assert_allclose([r[column] for r in scores["hurt"]], [r[column] for r in scores["clean"]],
                                   rtol=1e-9, atol=1e-12)
    assert first.recovered is None and again.recovered is None


def test_a_budget_larger_than_the_pool_is_refused_before_featurisation(ray_session, tiny_model_dir, tmp_path):
    cfg = yaml.safe_load(_config_file(tmp_path, tiny_model_dir).read_text())
    with pytest.raises(ConfigError, match=r"select.k: is larger than the pool's 5 candidate group\(s\) \(got 50\)"):
        run(config_from_dict(cfg | {"select": {"k": 50}}))
    with pytest.raises(ConfigError, match=r"finetune.ks: lists budgets larger than the pool's 5 .*\[50\]"):
        run(config_from_dict(cfg | {"finetune": cfg["finetune"] | {"ks": [1, 50]}}))
    assert not (tmp_path / "runs" / "t" / "vectors").exists()


def test_solve_on_a_failed_run_names_the_stage_it_failed_in(first_run, tmp_path):
    run_dir = own_copy(first_run, tmp_path / "failed")
    summary = json.loads((run_dir / "summary.json").read_text())
    summary.update(status="failed", failed_stage="featurize", error="RuntimeError: out of memory")
    summary.pop("order")
    (run_dir / "summary.json").write_text(json.dumps(summary))
    with pytest.raises(StoreError, match=r"the run failed in stage featurize before it had scores to re-solve "
                                         r"\(RuntimeError: out of memory\)"):
        resolve(run_dir, gamma=0.01, budget=None, method=None, normalize=None)


def test_a_gram_with_a_negative_diagonal_is_named_as_such(first_run, tmp_path):
    import numpy as np

    from convalue.solvers import KMMInputError

    run_dir = own_copy(first_run, tmp_path / "neg")
    K = np.load(run_dir / "gram.npy")
    K[2, 2] = -abs(K[2, 2])
    np.save(run_dir / "gram.npy", K)
    forget_checksum(run_dir, "gram.npy")  # a K put there by hand, not a damaged one
    with pytest.raises(KMMInputError, match=r"gram.npy\): K has 1 negative diagonal entry, first K\[2, 2\] = -"):
        resolve(run_dir, gamma=0.01, budget=None, method=None, normalize=None)
