"""Bad input found by an operator's sweep of the CLI: each refused with one `convalue: error:` line naming the
file, field and value, exit code 2, and nothing that looks complete left behind."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from conftest import tiny_run_config, write_jsonl

from convalue.engine.config import ConfigError, config_from_dict
from convalue.engine.driver.cli import main


def _refused(capsys, argv: list[str]) -> str:
    """The one error line of a refused command (exit code 2, no traceback)."""
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("convalue: error: ") and "\n" not in err and "Traceback" not in err, err
    return err


def _config(tmp_path, model_dir, target, pool, **over) -> str:
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(tiny_run_config(tmp_path, model_dir, target, pool, **over)))
    return str(path)


def test_an_infinite_learning_rate_is_refused(tiny_model_dir, pool_jsonl, target_jsonl, tmp_path):
    data = tiny_run_config(tmp_path, tiny_model_dir, target_jsonl, pool_jsonl,
                           finetune={"enabled": True, "steps": 3, "batch_size": 2, "lr": float("inf")})
    with pytest.raises(ConfigError, match=r"lr: must be a finite number > 0 \(got inf\)"):
        config_from_dict(data, file="run.yaml")


def test_a_gamma_ratio_of_one_or_more_is_refused(tiny_model_dir, pool_jsonl, target_jsonl, tmp_path):
    data = tiny_run_config(tmp_path, tiny_model_dir, target_jsonl, pool_jsonl, solver={"gamma": None,
                                                                                      "gamma_ratio": 1.5})
    with pytest.raises(ConfigError, match=r"solver.gamma_ratio: must be in \[0, 1\): at 1 or more every score is 0 "
                                          r"\(got 1.5\)"):
        config_from_dict(data, file="run.yaml")


def test_argument_errors_are_one_line(capsys, tmp_path):
    with pytest.raises(SystemExit) as stop:
        main(["solve", str(tmp_path), "--gamma", "abc"])
    err = capsys.readouterr().err.strip()
    assert stop.value.code == 2 and err == "convalue: error: argument --gamma: invalid float value: 'abc' (see `convalue solve --help`)"


def test_list_refuses_a_missing_folder_and_a_file(capsys, tmp_path):
    assert _refused(capsys, ["list", str(tmp_path / "nope")]).endswith("nope: no such folder")
    (tmp_path / "afile").write_text("x")
    assert _refused(capsys, ["list", str(tmp_path / "afile")]).endswith("afile: not a folder")


def test_yaml_errors_are_one_line_with_their_place(capsys, tmp_path):
    (tmp_path / "bad.yaml").write_text("name: x\n  solver: y\n")
    err = _refused(capsys, ["run", str(tmp_path / "bad.yaml"), "--dry-run"])
    assert err.endswith("bad.yaml: malformed YAML: mapping values are not allowed here at line 2, column 9")
    (tmp_path / "ok.yaml").write_text("name: x\n")
    err = _refused(capsys, ["run", str(tmp_path / "ok.yaml"), "--dry-run", "--set", "finetune.ks=[1, "])
    assert "--set finetune.ks: the value is not YAML (" in err and "at line 1, column 5" in err


def test_the_dry_run_refuses_budgets_and_prices_the_run_would_refuse(capsys, tiny_model_dir, pool_jsonl,
                                                                       target_jsonl, tmp_path):
    cfg = _config(tmp_path, tiny_model_dir, target_jsonl, pool_jsonl, select={"k": 9})
    err = _refused(capsys, ["run", cfg, "--dry-run"])
    assert err == (f"convalue: error: {cfg}: select.k: is larger than the pool's 4 candidate group(s) (got 9)")
    cfg = _config(tmp_path, tiny_model_dir, target_jsonl, pool_jsonl,
                  finetune={"enabled": True, "steps": 3, "batch_size": 2, "ks": [1, 50]})
    assert "finetune.ks: lists budgets larger than the pool's 4 candidate group(s): [50]" in _refused(
        capsys, ["run", cfg, "--dry-run"])
    (tmp_path / "costs.json").write_text(json.dumps({"english": 1, "spanish": -2, "german": 1, "hindi": 1}))
    cfg = _config(tmp_path, tiny_model_dir, target_jsonl, pool_jsonl,
                  solver={"gamma": None, "budget": 2.0, "costs_file": str(tmp_path / "costs.json")})
    assert "costs.json: price of group 'spanish' must be a finite number > 0, got -2" in _refused(
        capsys, ["run", cfg, "--dry-run"])
    assert not (tmp_path / "runs").exists()


def test_an_empty_target_file_is_named(capsys, tiny_model_dir, pool_jsonl, tmp_path):
    empty = write_jsonl(tmp_path / "empty.jsonl", [])
    err = _refused(capsys, ["run", _config(tmp_path, tiny_model_dir, empty, pool_jsonl), "--dry-run"])
    assert f"data.target ({empty}): no examples, so no target group" in err


def _vectors(path, groups: list[str], p: int = 8) -> str:
    rng = np.random.default_rng(0)
    pq.write_table(pa.table({"group": groups, "vector": [list(map(float, rng.normal(size=p))) for _ in groups]}),
                   path)
    np.save(path.with_name("target.npy"), rng.normal(size=p).astype(np.float32))
    return str(path)


def test_score_refuses_bad_k_bad_files_and_an_out_it_cannot_make(capsys, tmp_path):
    pool = _vectors(tmp_path / "pool.parquet", ["a", "b", "c", "d"])
    target = str(tmp_path / "target.npy")
    base = ["score", pool, "--target", target, "--gamma-ratio", "0.1", "--out", str(tmp_path / "runs")]
    assert _refused(capsys, [*base, "--name", "k0", "--k", "0"]) == "convalue: error: --k: must be at least 1 (got 0)"
    assert not (tmp_path / "runs" / "k0").exists()
    err = _refused(capsys, [*base, "--name", "k10", "--k", "10"])
    assert err == "convalue: error: --k: is larger than the pool's 4 candidate group(s) (got 10)"
    summary = json.loads((tmp_path / "runs" / "k10" / "summary.json").read_text())
    assert summary["status"] == "failed" and not (tmp_path / "runs" / "k10" / "scores.parquet").exists()
    dupes = _vectors(tmp_path / "dupes.parquet", ["a", "b", "a"])
    assert _refused(capsys, ["score", dupes, "--target", target, "--gamma-ratio", "0.1", "--out",
                             str(tmp_path / "runs"), "--name", "dupes"]).endswith("dupes.parquet: group 'a' appears twice")
    (tmp_path / "text.parquet").write_text("group,vector\n")
    assert "text.parquet: not a Parquet file (" in _refused(capsys, ["score", str(tmp_path / "text.parquet"),
                                                                    "--target", target, "--gamma-ratio", "0.1",
                                                                    "--out", str(tmp_path / "runs"), "--name", "t"])
    (tmp_path / "afile").write_text("x")
    err = _refused(capsys, ["score", pool, "--target", target, "--gamma-ratio", "0.1", "--out",
                            str(tmp_path / "afile"), "--name", "r"])
    assert err.startswith(f"convalue: error: --out: the run folder {tmp_path / 'afile' / 'r'} cannot be created: ")
