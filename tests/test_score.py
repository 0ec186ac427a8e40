"""`convalue score`: vectors made elsewhere (a Parquet of group, vector rows, or an earlier run) valued without a
model, equal to the solver on the same data, re-solvable, and bad files refused naming the file."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import own_copy

from convalue.engine.driver.cli import main
from convalue.engine.driver.resolve import resolve
from convalue.solvers import solve_kmm

pytestmark = pytest.mark.heavy  # whole runs: scheduled before the light modules (conftest.py)


def _pool(tmp_path, n: int = 300, p: int = 64, ragged: bool = False):
    rng = np.random.default_rng(5)
    centres = rng.normal(size=(12, p))
    G = (centres[rng.integers(0, 12, n)] + 0.3 * rng.normal(size=(n, p))).astype(np.float32)
    g = (centres[0] + 0.5 * centres[3]).astype(np.float32)
    vectors = [list(map(float, row)) for row in G]
    if ragged:
        vectors[7] = vectors[7][:-1]
    pq.write_table(pa.table({"group": [f"g{i:03d}" for i in range(n)], "vector": vectors,
                             "n_examples": list(range(n))}), tmp_path / "pool.parquet")
    np.save(tmp_path / "target.npy", g)
    return G, g


def test_imported_vectors_score_as_the_solver_says_and_re_solve(ray_session, tmp_path, capsys):
    G, g = _pool(tmp_path)
    rc = main(["score", str(tmp_path / "pool.parquet"), "--target", str(tmp_path / "target.npy"),
               "--gamma-ratio", "0.05", "--k", "4", "--out", str(tmp_path / "runs"), "--name", "pool"])
    assert rc == 0 and "selected (top-4 with positive score)" in capsys.readouterr().out
    run_dir = tmp_path / "runs" / "pool"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "complete" and summary["data"]["candidates"] == 300 and summary["space"] == "gram"
    G64, g64 = G.astype(np.float64), g.astype(np.float64)
    K, beta = G64 @ G64.T, G64 @ g64
    np.testing.assert_allclose(np.load(run_dir / "gram.npy"), K, rtol=1e-9, atol=1e-9)
    expected = solve_kmm(K, beta, gamma=summary["solver"]["gamma"], normalize="cosine").w
    scores = {r["group"]: r["score"] for r in pq.read_table(run_dir / "scores.parquet").to_pylist()}
    np.testing.assert_allclose([scores[n] for n in summary["order"]], expected, atol=1e-9)
    assert summary["solver"]["gamma_ratio"] == 0.05 and (run_dir / "report.html").is_file()
    out = resolve(run_dir, gamma=summary["solver"]["gamma"] / 2, budget=None, method=None, normalize=None)
    assert out.solver.gamma == pytest.approx(summary["solver"]["gamma"] / 2) and out.status == "complete"
    gradients = main(["score", str(tmp_path / "pool.parquet"), "--target", str(tmp_path / "target.npy"),
                      "--gamma", str(summary["solver"]["gamma"]), "--space", "gradients", "--out",
                      str(tmp_path / "runs"), "--name", "grad"])
    assert gradients == 0 and not (tmp_path / "runs" / "grad" / "gram.npy").exists()
    grad = {r["group"]: r["score"] for r in pq.read_table(tmp_path / "runs" / "grad" / "scores.parquet").to_pylist()}
    np.testing.assert_allclose([grad[n] for n in summary["order"]], expected, atol=1e-6)


def test_an_earlier_run_is_scored_again_from_its_store(first_run, tmp_path):
    _, data, summary = first_run
    run_dir = own_copy(first_run, tmp_path / "runs" / "t")
    rc = main(["score", str(run_dir), "--gamma", str(data["solver"]["gamma"]), "--k", str(data["select"]["k"]),
               "--out", str(tmp_path / "runs"), "--name", "again"])
    assert rc == 0
    again = json.loads((tmp_path / "runs" / "again" / "summary.json").read_text())
    assert again["selected"] == summary.selected
    old = {r["group"]: r["score"] for r in pq.read_table(run_dir / "scores.parquet").to_pylist()}
    new = {r["group"]: r["score"] for r in pq.read_table(tmp_path / "runs" / "again" / "scores.parquet").to_pylist()}
    assert new.keys() == old.keys()
    np.testing.assert_allclose([new[n] for n in old], list(old.values()), atol=1e-9)


def test_bad_vector_files_are_refused_naming_the_file(ray_session, tmp_path, capsys):
    _pool(tmp_path, ragged=True)
    rc = main(["score", str(tmp_path / "pool.parquet"), "--target", str(tmp_path / "target.npy"), "--gamma", "0.1",
               "--out", str(tmp_path / "runs")])
    assert rc == 2 and "pool.parquet: rows of `vector` have lengths 63..64" in capsys.readouterr().err
    rc = main(["score", str(tmp_path / "pool.parquet"), "--gamma", "0.1", "--out", str(tmp_path / "runs"),
               "--overwrite", "--name", "x"])
    assert rc == 2
    rc = main(["score", str(tmp_path / "nothing.parquet"), "--gamma", "0.1", "--out", str(tmp_path / "runs")])
    assert rc == 2 and "nothing.parquet: no such vectors file or run folder" in capsys.readouterr().err


def test_a_bare_file_name_is_read_from_the_current_directory(ray_session, tmp_path, monkeypatch):
    _pool(tmp_path, n=60, p=16)
    monkeypatch.chdir(tmp_path)
    rc = main(["score", "pool.parquet", "--target", "target.npy", "--gamma-ratio", "0.1", "--out", "runs"])
    assert rc == 0 and (tmp_path / "runs" / "scored" / "scores.parquet").is_file()
