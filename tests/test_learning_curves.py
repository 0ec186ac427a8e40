"""finetune.eval_every: each fine-tune's learning curve (every evaluation's loss every N steps), which leaves the
training as it was; the cells' mean curves and where each is lowest."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import chatterbot_pairs, tiny_run_config, write_jsonl
from test_finetune_store import AUX, SPEC, _store, _with

from convalue.engine.config import ConfigError, FinetuneConfig, config_from_dict
from convalue.engine.protocol.curves import cell_curves
from convalue.engine.report.tables import curve_lines

CURVE_TABLE = Path(__file__).parents[1] / "bench" / "curve_table.py"


def _curve_row(method: str, k: int | None, seed: int, held: dict[int, float], val: dict[int, float]) -> dict:
    return {"method": method, "k": k, "seed": seed,
            "curve": [{"step": s, "losses": {"held": held[s], "target_val": val[s]}} for s in held]}


def _row(method: str, k: int | None, seed: int, points: dict[int, float]) -> dict:
    """A row whose target_val curve is its `held` curve plus 1."""
    return _curve_row(method, k, seed, points, {s: v + 1 for s, v in points.items()})


def test_a_cell_s_curve_is_the_mean_over_its_seeds_at_the_steps_all_of_them_measured():
    rows = [_row("kmm", 3, 0, {2: 3.0, 4: 2.0, 6: 2.5}), _row("kmm", 3, 1, {2: 2.0, 4: 2.2, 6: 2.1}),
            _row("target_only", None, 0, {2: 3.0, 4: 2.5, 5: 2.4}),  # additive runs end at different steps
            _row("target_only", None, 1, {2: 3.2, 4: 2.7, 7: 2.0}),
            {"method": "random", "k": 3, "seed": 0}]  # no curve: adds nothing
    curves = {(c.method, c.evaluation): c for c in cell_curves(rows, ["held", "target_val"])}
    assert set(curves) == {("kmm", "held"), ("kmm", "target_val"), ("target_only", "held"),
                           ("target_only", "target_val")}
    kmm = curves["kmm", "held"]
    assert kmm.steps == [2, 4, 6] and kmm.mean == pytest.approx([2.5, 2.1, 2.3]) and kmm.seeds == 2
    assert kmm.best_step == 4 and kmm.to_dict()["best"] == pytest.approx(2.1)
    alone = curves["target_only", "held"]
    assert alone.steps == [2, 4] and alone.best_step == 4 and alone.k is None
    assert curves["kmm", "target_val"].mean == pytest.approx([3.5, 3.1, 3.3])
    diverged = cell_curves([_row("kmm", 3, 0, {2: float("nan"), 4: 2.0, 6: 2.5})], ["held"])[0]
    assert diverged.best_step == 4 and diverged.best == 2.0  # a NaN point is never the lowest
    damaged = [{"method": "kmm", "k": 3, "seed": 0, "curve": [{"step": "2", "losses": {"held": 1.0}}]}]
    assert cell_curves(damaged, ["held"]) == []


def test_the_curve_lines_name_each_cell_s_lowest_point_on_select_by_s_evaluation():
    rows = [_row("kmm", 3, 0, {2: 3.0, 4: 2.0, 6: 2.5}), _row("target_only", None, 0, {2: 3.0, 4: 2.9, 6: 2.8})]
    evaluation = {"select_by": "held:loss", "curves": [c.to_dict() for c in cell_curves(rows, ["held"])]}
    lines = curve_lines(evaluation, "held")
    assert "loss on held" in lines[0]
    assert "KMM k=3" in lines[1] and "lowest 2.0000 at step 4; at step 6, the last all 1 seed(s) measured: 2.5000" \
        in lines[1]
    assert "lowest 2.8000 at step 6;" in lines[2]
    assert curve_lines(evaluation, "target_val") == []  # curves of another evaluation only
    assert curve_lines({"curves": [{"evaluation": "held", "steps": [1], "mean": "damaged"}]}, "held") == []


def test_eval_every_keys_a_fine_tune_only_when_set_and_is_refused_where_no_curve_is_drawn(tmp_path):
    plain, curved = _store(tmp_path), _store(tmp_path, _with(SPEC, eval_every=4))
    assert "eval_every" not in plain._base["settings"]["finetune"]  # keys of before the curve existed stand
    assert curved.job_key(AUX) != plain.job_key(AUX) and curved.job_key({}) != plain.job_key({})
    for bad in ({"eval_every": -1}, {"eval_every": 2, "objective": "grpo"}, {"eval_every": 2, "strategy": "deepspeed"}):
        with pytest.raises(ConfigError, match="eval_every"):
            FinetuneConfig(**bad).validate()
    FinetuneConfig(eval_every=2).validate()


def test_a_job_s_curve_holds_every_evaluation_every_n_steps_and_leaves_the_training_as_it_was(tiny_model_dir,
                                                                                             tmp_path):
    """One fine-tune job (no Ray) with eval_every 2 over 5 steps: points at steps 2 and 4 and the end's (5), each
    with every evaluation's loss; the end's equal the job's evaluations, and the job without a curve trains the
    same adapter (the same losses). LoRA dropout draws from torch's generator in train mode, so an evaluation that
    drew, or a model left in eval mode after one, would change the losses."""
    from convalue.actors.finetune_job import run_finetune_job
    from convalue.engine.data.prepare import prepare
    from convalue.engine.model.loading import load_tokenizer
    from convalue.engine.model.spec import ReplicaSpec

    tok = load_tokenizer(tiny_model_dir)
    target = write_jsonl(tmp_path / "marathi.jsonl", chatterbot_pairs("marathi", 12))
    pool = write_jsonl(tmp_path / "pool.jsonl", [r | {"group": "hindi"} for r in chatterbot_pairs("hindi", 6)])
    held = write_jsonl(tmp_path / "held.jsonl", chatterbot_pairs("hindi", 12)[6:])
    data = tiny_run_config(tmp_path, tiny_model_dir, target, pool,
                           finetune={"enabled": True, "steps": 5, "batch_size": 2, "lr": 1e-3})
    data["lora"] = data.get("lora", {}) | {"dropout": 0.1}
    data["data"]["eval"] = {"held": {"kind": "jsonl", "path": str(held)}}
    results = {}
    for every in (0, 2):
        cfg = config_from_dict(data | {"finetune": data["finetune"] | {"eval_every": every}})
        prepared = prepare(cfg.data, tok, cfg.model.max_length)
        spec = ReplicaSpec.from_config(cfg, tiny_model_dir, tok.pad_token_id)
        results[every] = run_finetune_job(spec, "target + hindi", prepared.target_train,
                                          {"hindi": list(prepared.items[0].examples)}, prepared.target_val, False,
                                          evals=prepared.evals)
    plain, curved = results[0], results[2]
    assert plain.curve is None
    assert [p.step for p in curved.curve] == [2, 4, 5] and curved.steps == 5
    assert all(set(p.losses) == {"target_val", "held"} for p in curved.curve)
    assert curved.curve[-1].losses == {n: s.loss for n, s in curved.evaluations.items()}
    assert curved.curve[0].losses["held"] != curved.curve[-1].losses["held"]  # the adapter moved in between
    assert curved.val_loss == pytest.approx(plain.val_loss, rel=1e-6)
    assert curved.last_train_loss == pytest.approx(plain.last_train_loss, rel=1e-6)
    assert curved.evaluations["held"].loss == pytest.approx(plain.evaluations["held"].loss, rel=1e-6)
    record = json.loads(json.dumps(curved.to_dict()))  # as the fine-tune store keeps it
    assert record["curve"][1] == {"step": 4, "losses": curved.curve[1].losses}


def _curve_table(tmp_path: Path, rows: list[dict], *args: str) -> subprocess.CompletedProcess:
    """bench/curve_table.py on a complete summary of `rows` (select_by held:loss) written to tmp_path."""
    evaluation = {"select_by": "held:loss", "curves": [c.to_dict() for c in cell_curves(rows, ["held"])]}
    (tmp_path / "summary.json").write_text(json.dumps({"status": "complete", "finetune": rows,
                                                       "evaluation": evaluation}))
    return subprocess.run([sys.executable, str(CURVE_TABLE), str(tmp_path), *args], capture_output=True, text=True,
                          timeout=120)


def test_the_curve_table_pairs_the_selection_with_the_target_alone_at_every_step(tmp_path):
    """bench/curve_table.py on a summary written by hand: each cell's mean per step with its lowest in bold, and
    KMM minus the target alone paired by seed at each step (here KMM is 0.1 lower at step 4 in every seed)."""
    rows = [_row("kmm", 3, s, {2: 3.0 + 0.01 * s, 4: 2.0 + 0.01 * s}) for s in range(3)] + [
        _row("target_only", None, s, {2: 2.9 + 0.02 * s, 4: 2.1 + 0.01 * s}) for s in range(3)]
    out = _curve_table(tmp_path, rows)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("loss on held,") and "| step | KMM k=3 | target only | KMM k=3 − target only |" in lines
    step4 = next(line for line in lines if line.startswith("| 4 |"))
    assert step4.startswith("| 4 | **2.0100** | **2.1100** | **-0.1000 [")  # resolved: the same gap in every seed
    val = lines[next(i for i, line in enumerate(lines) if line.startswith("loss on target_val,")):]  # after held
    step2 = next(line for line in val if line.startswith("| 2 |"))
    assert step2.startswith("| 2 | 4.0100 | 3.9200 | **+0.0900 [")  # step 2's difference, not the end's (-0.1)
    (tmp_path / "summary.json").write_text(json.dumps({"status": "complete", "finetune": rows, "evaluation": {}}))
    refused = subprocess.run([sys.executable, str(CURVE_TABLE), str(tmp_path)], capture_output=True, text=True,
                             timeout=120)
    assert refused.returncode == 2 and "no learning curves" in refused.stderr


def test_the_curve_table_stops_each_cell_at_its_own_best_step(tmp_path):
    """bench/curve_table.py's last table: each cell read at the lowest step of its mean curve on --choose-on
    (target_val by default: KMM's at step 4, the target alone's at step 2; on `held` both at 6), one seed's own
    lowest elsewhere, paired by seed there; a method not run at every k leaves that k's pair out."""
    held = {2: 3.0, 4: 2.5, 6: 2.0}
    rows = [_curve_row("kmm", 3, s, held, {2: 3.0, 4: 2.0 + 0.01 * s, 6: 2.5 if s else 1.9}) for s in range(3)] + [
        _curve_row("kmm", 6, s, held, {2: 3.0, 4: 2.1, 6: 2.4}) for s in range(3)] + [
        _curve_row("random", 3, s, held, {2: 2.9, 4: 2.8, 6: 2.7}) for s in range(3)] + [
        _curve_row("target_only", None, s, {2: 2.6, 4: 2.4, 6: 2.1 + 0.01 * s},
                   {2: 2.2 + 0.01 * s, 4: 2.6, 6: 3.0}) for s in range(3)]
    out = _curve_table(tmp_path, rows)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert "| cell | step (by seed) | held | target_val |" in lines
    assert "| KMM k=3 | 4 (6, 4, 4) | 2.5000 | 2.0100 |" in lines  # seed 0's own lowest (6) is not its cell's
    assert "| target only | 2 (2, 2, 2) | 2.6000 | 2.2100 |" in lines
    diff = next(line for line in lines if line.startswith("| KMM k=3 − target only |"))
    assert diff.startswith("| KMM k=3 − target only | **-0.1000 [-0.1000, -0.1000]** | **-0.2000 [")  # 4 vs 2
    assert any(line.startswith("| KMM k=6 − target only |") for line in lines)
    assert not any(line.startswith("| KMM k=6 − random") for line in lines)  # random ran at k = 3 only
    on_held = _curve_table(tmp_path, rows, "--choose-on", "held")
    assert on_held.returncode == 0, on_held.stderr
    lines = on_held.stdout.splitlines()
    assert "| KMM k=3 | 6 (6, 6, 6) | 2.0000 | 2.3000 |" in lines
    assert "| target only | 6 (6, 6, 6) | 2.1100 | 3.0000 |" in lines
