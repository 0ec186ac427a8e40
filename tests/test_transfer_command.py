"""`convalue transfer`: every group of the pool, the target included, valued as the target against all the others
from one featurisation (paper Fig. pairwise_relation), then the positive/negative-set fine-tunes (Tab. zh_results),
at a tiny size: 6 groups (5 chatterbot languages and a Marathi target), 2-step fine-tunes; a rerun trains
nothing; another group as transfer.target; bad input refused."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml
from conftest import pipeline_run_config

from convalue.engine.config import ConfigError, config_from_dict
from convalue.engine.driver.transfer import format_transfer, run_transfer
from convalue.engine.files.folder import RunFolder
from convalue.engine.protocol.transfer import positive_negative, signed_ranks, transfer_scores
from convalue.engine.store.vectors import VectorStore

pytestmark = pytest.mark.heavy  # whole runs: scheduled before the light modules (conftest.py)


@pytest.fixture(scope="module")
def transfer_config(ray_session, tiny_model_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("transfer")
    data = pipeline_run_config(tmp, tiny_model_dir)
    return tmp, data | {"name": "tr", "finetune": {"enabled": False, "steps": 2, "batch_size": 2},
                        "transfer": {"gamma_ratio": 0.01, "positive": 2, "negative": 2}}


@pytest.fixture(scope="module")
def transfer_run(transfer_config):
    tmp, data = transfer_config
    return tmp, data, run_transfer(config_from_dict(data))


def test_transfer_matrix_from_one_featurisation_and_the_check(transfer_run):
    tmp, data, summary = transfer_run
    run_dir = tmp / "runs" / "tr"
    assert summary.status == "complete"
    for f in ("transfer.parquet", "transfer.png", "summary.json", "report.html", "scores.parquet"):
        assert (run_dir / f).is_file(), f
    t = summary.evaluation["transfer"]
    groups = ["marathi", "english", "spanish", "german", "hindi", "italian"]
    assert t["groups"] == groups and t["target"] == "marathi" and sorted(t["order"]) == sorted(groups)
    assert summary.featurize["groups_computed"] == 6  # the target and the five candidates, once

    # the matrix is transfer_scores of the stored vectors: the target's row first, then the run's order
    store = VectorStore.reader(RunFolder.at(str(tmp / "runs"), "tr").sub("vectors"))
    G = store.load(["__target__", *summary.order])[0].astype(np.float64)
    W = transfer_scores(G, gamma_ratio=0.01, normalize="cosine")
    R = signed_ranks(W)
    rows = pq.read_table(run_dir / "transfer.parquet").to_pylist()
    assert len(rows) == 30 and set(rows[0]) == {"target", "source", "score", "signed_rank"}
    for r in rows:
        i, j = groups.index(r["target"]), groups.index(r["source"])
        assert r["score"] == pytest.approx(W[i, j], rel=1e-6, abs=1e-9) and r["signed_rank"] == R[i, j]
    pn = positive_negative(W, groups, "marathi", n_pos=2, n_neg=2)
    assert (t["positive"], t["negative"]) == (list(pn.positive), list(pn.negative))

    # the check: target only, + positive, + positive + negative, as stored in finetunes/
    runs = t["runs"]
    assert list(runs) == ["target_only", "pos", "pos_neg"]
    records = {tuple(r["groups"]): r for r in (json.loads(p.read_text())
                                               for p in (run_dir / "finetunes").glob("*.json")) if "groups" in r}
    for label, groups_of in pn.runs().items():
        rec = records[tuple(sorted(groups_of))]
        assert runs[label]["groups"] == list(groups_of)
        assert (runs[label]["val_loss"], runs[label]["train_loss"]) == (rec["val_loss"], rec["last_train_loss"])
    distinct = len({tuple(sorted(g)) for g in pn.runs().values()})
    assert t["fine_tunes"] == {"trained": distinct, "reused": 0} and t["base_val_loss"] > 0
    text = format_transfer(summary)
    assert "target + positive + negative" in text and f"{distinct} trained" in text


def test_a_rerun_trains_nothing_and_another_target_uses_its_own_split(transfer_run):
    tmp, data, first = transfer_run
    again = run_transfer(config_from_dict(data))
    t = again.evaluation["transfer"]
    assert t["fine_tunes"]["trained"] == 0 and again.featurize["groups_computed"] == 0
    assert t["row"] == first.evaluation["transfer"]["row"]
    # spanish as the target: its row, and fine-tunes on spanish's own train/validation split (marathi a source)
    other = run_transfer(config_from_dict(data | {"transfer": data["transfer"] | {"target": "spanish"}}))
    s = other.evaluation["transfer"]
    assert other.featurize["groups_computed"] == 0 and s["target"] == "spanish" and "marathi" in s["row"]
    assert s["fine_tunes"]["trained"] >= 1
    assert s["runs"]["target_only"]["val_loss"] != t["runs"]["target_only"]["val_loss"]
    assert set(s["positive"]) | set(s["negative"]) <= set(s["row"]) - {"spanish"}


def test_bad_transfer_input_is_refused_before_any_work(transfer_config):
    tmp, data = transfer_config
    bad = data | {"name": "bad"}
    with pytest.raises(ConfigError, match=r"transfer.target: is not a group of the pool .* \(got 'klingon'\)"):
        run_transfer(config_from_dict(bad | {"transfer": {"target": "klingon"}}))
    with pytest.raises(ConfigError, match="features.metric"):
        run_transfer(config_from_dict(bad | {"features": {"metric": "diag_fisher"}}))
    with pytest.raises(ConfigError, match=r"transfer.gamma_ratio: must be in \[0, 1\)"):
        config_from_dict(bad | {"transfer": {"gamma_ratio": 1.5}})
    with pytest.raises(ConfigError, match=r"transfer.positive: must be >= 1 with check: true"):
        config_from_dict(bad | {"transfer": {"positive": 0}})
    assert not (tmp / "runs" / "bad").exists()

    (tmp / "bad.yaml").write_text(yaml.safe_dump(bad))
    r = subprocess.run([sys.executable, "-m", "convalue", "transfer", str(tmp / "bad.yaml"),
                        "--set", "transfer.target=klingon"], capture_output=True, text=True)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "transfer.target: is not a group of the pool" in r.stderr and "(got 'klingon')" in r.stderr
    assert not (tmp / "runs" / "bad").exists()
