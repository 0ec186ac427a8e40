"""`convalue faithfulness`: every k-subset of the candidates fine-tuned, u_FT against the additive and KMM
surrogates of each representation (paper Tab. subset-faithfulness), at a tiny size: 5 chatterbot languages,
k = 2 (10 subsets), 2-step fine-tunes, two representations; a rerun trains nothing; bad input refused."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml
from conftest import pipeline_run_config

from convalue.engine.config import ConfigError, config_from_dict
from convalue.engine.driver.faithfulness import format_faithfulness, run_faithfulness
from convalue.engine.files.folder import RunFolder
from convalue.engine.protocol.faithfulness import agreement
from convalue.engine.store.vectors import VectorStore

pytestmark = pytest.mark.heavy  # whole runs: scheduled before the light modules (conftest.py)


@pytest.fixture(scope="module")
def faith_config(ray_session, tiny_model_dir, tmp_path_factory):
    """(folder, config data): the pipeline tests' pool (english, spanish, german, hindi, italian; Marathi target),
    one-step and task vectors, k = 2 over all five candidates, 2-step fine-tunes."""
    tmp = tmp_path_factory.mktemp("faith")
    data = pipeline_run_config(tmp, tiny_model_dir)
    data = data | {"name": "faith",
                   "features": {"representations": ["one_step", "task_vector"], "tv_steps": 2, "tv_batch_size": 2},
                   "finetune": {"enabled": False, "steps": 2, "batch_size": 2},
                   "faithfulness": {"k": 2, "top": 3}}
    return tmp, data


@pytest.fixture(scope="module")
def faith_run(faith_config):
    tmp, data = faith_config
    return tmp, data, run_faithfulness(config_from_dict(data))


def _records(run_dir: Path) -> dict[tuple[str, ...], dict]:
    """The run folder's stored fine-tunes by their (sorted) groups."""
    out = {}
    for p in (run_dir / "finetunes").glob("*.json"):
        r = json.loads(p.read_text())
        if "groups" in r:
            out[tuple(r["groups"])] = r
    return out


def test_faithfulness_writes_u_ft_surrogates_and_agreements(faith_run):
    tmp, data, summary = faith_run
    run_dir = tmp / "runs" / "faith"
    assert summary.status == "complete"
    for f in ("faithfulness.parquet", "faithfulness.png", "summary.json", "report.html", "scores.parquet",
              "gram.npy", "beta.npy", "gram-tv.npy", "beta-tv.npy"):
        assert (run_dir / f).is_file(), f
    f = summary.evaluation["faithfulness"]
    assert f["subsets"] == 10 and f["k"] == 2 and f["fine_tunes"] == {"trained": 11, "reused": 0}
    assert [(a["method"], a["subsets"], a["top"]) for a in f["agreement"]] == [
        ("One-Step", 10, 3), ("One-Step + KMM", 10, 3), ("TV", 10, 3), ("TV + KMM", 10, 3)]
    table = pq.read_table(run_dir / "faithfulness.parquet").to_pylist()
    assert len(table) == 10 and set(table[0]) == {"subset", "u_ft", "one_step_additive", "one_step_kmm",
                                                  "tv_additive", "tv_kmm", "val_loss"}

    # u_FT = L_val(target only) - L_val(target + S), from the fine-tunes the run folder keeps
    records = _records(run_dir)
    assert len(records) == 11
    target_only = records[()]["val_loss"]
    assert f["target_only_val_loss"] == target_only
    for row in table:
        assert row["val_loss"] == records[tuple(sorted(row["subset"]))]["val_loss"]
        assert row["u_ft"] == pytest.approx(target_only - row["val_loss"], abs=1e-12)

    # the surrogates from the saved Gram: cosine K and beta (the target's norm from the stored vectors)
    order = summary.order
    for tag, suffix in (("one_step", ""), ("tv", "-tv")):
        K, beta = np.load(run_dir / f"gram{suffix}.npy"), np.load(run_dir / f"beta{suffix}.npy")
        folder = RunFolder.at(str(tmp / "runs"), "faith").sub("vectors" if tag == "one_step" else
                                                               "vectors-task_vector")
        g_tar = VectorStore.reader(folder).load(["__target__"])[0][0].astype(np.float64)
        assert f["target_norm"][tag] == pytest.approx(float(np.linalg.norm(g_tar)), rel=1e-6)
        d = np.sqrt(np.diag(K))
        for row in table[:3]:
            s = [order.index(n) for n in row["subset"]]
            cos_beta = beta[s] / (d[s] * np.linalg.norm(g_tar))
            cos_K = K[np.ix_(s, s)] / np.outer(d[s], d[s])
            assert row[f"{tag}_additive"] == pytest.approx(cos_beta.sum(), rel=1e-6)
            assert row[f"{tag}_kmm"] == pytest.approx(cos_beta.sum() - 0.5 * cos_K.sum(), rel=1e-6)
        u = np.array([r["u_ft"] for r in table])
        for surrogate in ("additive", "kmm"):
            rho, p, overlap = agreement(u, np.array([r[f"{tag}_{surrogate}"] for r in table]), top=3)
            a = next(a for a in f["agreement"] if (a["representation"], a["surrogate"]) == (tag, surrogate))
            assert (a["spearman_rho"], a["p_value"], a["top_overlap"]) == pytest.approx((rho, p, overlap))
    text = format_faithfulness(summary)
    assert "TV + KMM" in text and "11 trained, 0 read back" in text


def test_a_rerun_trains_nothing_new_and_gives_the_same_table(faith_run):
    tmp, data, first = faith_run
    run_dir = tmp / "runs" / "faith"
    before = sorted(p.name for p in (run_dir / "finetunes").glob("*.json"))
    again = run_faithfulness(config_from_dict(data))
    assert again.evaluation["faithfulness"]["fine_tunes"] == {"trained": 0, "reused": 11}
    assert again.featurize["groups_computed"] == 0
    assert sorted(p.name for p in (run_dir / "finetunes").glob("*.json")) == before
    assert again.evaluation["faithfulness"]["agreement"] == first.evaluation["faithfulness"]["agreement"]
    # a sample of the subsets of three named candidates: reused too
    sampled = run_faithfulness(config_from_dict(data | {"faithfulness": {
        "candidates": ["english", "german", "hindi", "italian"], "k": 2, "sample": 4, "seed": 1}}))
    f = sampled.evaluation["faithfulness"]
    assert f["subsets"] == 4 and f["sampled"] and f["fine_tunes"] == {"trained": 0, "reused": 5}
    assert all(set(r["subset"]) <= {"english", "german", "hindi", "italian"}
               for r in pq.read_table(run_dir / "faithfulness.parquet").to_pylist())


def test_bad_faithfulness_input_is_refused_before_any_work(faith_config):
    tmp, data = faith_config
    bad = data | {"name": "bad"}
    with pytest.raises(ConfigError, match=r"faithfulness.candidates: names groups that are not candidates of the "
                                          r"run: \['klingon'\]"):
        run_faithfulness(config_from_dict(bad | {"faithfulness": {"candidates": ["english", "klingon"], "k": 1,
                                                                   "sample": 3}}))
    with pytest.raises(ConfigError, match=r"faithfulness.k: is larger than the 5 candidate group\(s\)"):
        run_faithfulness(config_from_dict(bad | {"faithfulness": {"k": 6}}))
    with pytest.raises(ConfigError, match=r"faithfulness.k: gives C\(5, 5\) = 1 subset"):
        run_faithfulness(config_from_dict(bad | {"faithfulness": {"k": 5}}))
    with pytest.raises(ConfigError, match=r"faithfulness.k: is larger than the 2 group\(s\) of "
                                          r"faithfulness.candidates"):
        config_from_dict(bad | {"faithfulness": {"candidates": ["english", "german"], "k": 3}})
    with pytest.raises(ConfigError, match=r"faithfulness.candidates: names \['german'\] more than once"):
        config_from_dict(bad | {"faithfulness": {"candidates": ["german", "german"]}})
    with pytest.raises(ConfigError, match="solver.space"):
        run_faithfulness(config_from_dict(bad | {"solver": data["solver"] | {"space": "gradients"}}))
    assert not (tmp / "runs" / "bad").exists()

    (tmp / "bad.yaml").write_text(yaml.safe_dump(bad))  # the command line: exit code 2, field and value named
    r = subprocess.run([sys.executable, "-m", "convalue", "faithfulness", str(tmp / "bad.yaml"),
                        "--set", "faithfulness.candidates=[english, klingon]", "--set", "faithfulness.k=1"],
                       capture_output=True, text=True)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "faithfulness.candidates: names groups that are not candidates of the run: ['klingon']" in r.stderr
    assert "got ['english', 'klingon']" in r.stderr
    assert not (tmp / "runs" / "bad").exists()
