"""A run whose `out` is on a non-local pyarrow filesystem (a real S3 API on loopback, moto's server): the workers
write their blocks there, the driver its results; status, report, resume and re-solve read it there."""

from __future__ import annotations

import io
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from conftest import tiny_run_config

from convalue.engine.config import config_from_dict
from convalue.engine.driver.pipeline import run
from convalue.engine.driver.resolve import resolve
from convalue.engine.files.folder import RunFolder
from convalue.engine.report.status_text import list_runs
from convalue.engine.store.status import run_status
from convalue.solvers import solve_kmm


def test_a_run_on_s3_writes_resumes_and_re_solves_there(ray_session, tiny_model_dir, pool_jsonl, target_jsonl,
                                                          tmp_path, s3_base):
    data = tiny_run_config(tmp_path, tiny_model_dir, target_jsonl, pool_jsonl, out=s3_base, name="remote")
    first = run(config_from_dict(data))
    folder = RunFolder.at(s3_base, "remote")
    assert first.status == "complete" and folder.local is None
    for name in ("summary.json", "scores.parquet", "gram.npy", "beta.npy", "examples.parquet", "scores.png",
                 "report.html", "vectors/manifest.json"):
        assert folder.is_file(name), name
    blocks = [n for n in folder.sub("vectors").names() if n.endswith(".parquet")]
    assert len(blocks) >= 2 and json.loads(folder.read_text("summary.json"))["status"] == "complete"
    assert not (tmp_path / "runs").exists()  # nothing landed on the local disk
    status = run_status(s3_base.replace("/runs?", "/runs/remote?"))
    assert status.state == "complete" and status.problems == [] and status.vectors.damaged == []
    assert [r["name"] for r in list_runs(s3_base)] == ["remote"]

    again = run(config_from_dict(data))  # resumes from the blocks on S3
    assert again.featurize["groups_computed"] == 0 and again.featurize["groups_reused"] == 5

    gamma = data["solver"]["gamma"] / 2
    out = resolve(folder, gamma=gamma, budget=None, method=None, normalize=None)
    scores = pq.read_table(pa.BufferReader(folder.read_bytes("scores.parquet"))).to_pylist()
    K = np.load(io.BytesIO(folder.read_bytes("gram.npy")))
    beta = np.load(io.BytesIO(folder.read_bytes("beta.npy")))
    expected = solve_kmm(K, beta, gamma=gamma, normalize=out.solver.normalize).w
    by_name = {r["group"]: r["score"] for r in scores}
    np.testing.assert_allclose([by_name[n] for n in out.order], expected, atol=1e-9)
