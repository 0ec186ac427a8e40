"""Incremental valuation: a pool grown by new groups, valued again in the same run folder, computes only the new
rows (their Gram tiles, or in gradient space their statistics and residuals), starts from the prior w, and gives the
scores of a from-scratch valuation (certified: objective, KKT, support), for `convalue score` with a grown vector file
on a three-node Ray cluster and for `convalue run` with more candidates."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import three_node_cluster, tiny_run_config, write_jsonl

from convalue.engine.selection.blocked import BlockRows
from convalue.engine.selection.incremental import (
    ValuationState,
    place_old_gram,
    reuse_of,
    split_blocks,
)
from convalue.solvers import solve_kmm_gradients
from convalue.solvers.sharded import Prior, ShardedGradients, ShardPolicy, solve_sharded

pytestmark = pytest.mark.heavy  # whole runs: scheduled before the light modules (conftest.py)

NODES = ("node_a", "node_b", "node_c")


def _clustered(n: int, p: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(max(2, n // 10), p))
    G = centres[rng.integers(0, len(centres), n)] + 0.3 * rng.normal(size=(n, p))
    return G, centres[0] + 0.5 * centres[1] - 0.3 * centres[2] + 0.1 * rng.normal(size=p)


def _state(names, files, w, residual=None, target=None) -> ValuationState:
    n = len(names)
    return ValuationState(order=list(names), files=list(files), target=np.ones(3) if target is None else target,
                          metric="euclidean", normalize="cosine", space="gram", gamma=0.1, w=np.asarray(w, float),
                          beta=np.arange(n, dtype=float), diag=np.ones(n), norm2=np.ones(n), cosine=np.zeros(n),
                          residual=np.zeros(n) if residual is None else residual)


def test_a_state_round_trips_and_maps_a_grown_pool_onto_its_rows():
    state = _state(["a", "b", "c"], ["f1", "f1", "f2"], [0.0, 0.5, 0.0])
    back = ValuationState.from_bytes(state.to_bytes())
    assert back.order == state.order and back.files == state.files and np.array_equal(back.w, state.w)
    # c moved to another block (its vector changed), d is new, a left (with w = 0): the residual still holds
    reuse, _ = reuse_of(state, ["b", "c", "d"], ["f1", "f3", "f3"], np.ones(3), "euclidean", "cosine")
    assert list(reuse.old) == [1, -1, -1] and list(reuse.new_rows) == [1, 2] and reuse.residual_exact
    assert list(reuse.w0()) == [0.5, 0.0, 0.0] and list(reuse.carried("beta", np.full(3, 9.0))) == [1.0, 9.0, 9.0]
    # b, which carried a score, left: w0 is still a warm start, its residual is not
    reuse, _ = reuse_of(state, ["a", "c"], ["f1", "f2"], np.ones(3), "euclidean", "cosine")
    assert not reuse.residual_exact
    for changed in ({"target": np.zeros(3)}, {"metric": "diag_fisher"}, {"normalize": "none"}):
        args = {"target": np.ones(3), "metric": "euclidean", "normalize": "cosine"} | changed
        assert reuse_of(state, ["a"], ["f1"], **args)[0] is None
    with pytest.raises(ValueError, match="not a valuation state"):
        ValuationState.from_bytes(b"not an npz")


def test_the_old_gram_lands_on_the_reused_rows_and_blocks_split_into_old_and_new_rows():
    old = np.arange(16.0).reshape(4, 4)
    state = _state(["a", "b", "c", "d"], ["f"] * 4, np.zeros(4))
    reuse, _ = reuse_of(state, ["c", "x", "a", "d"], ["f", "g", "f", "f"], np.ones(3), "euclidean", "cosine")
    K = np.full((4, 4), np.nan)
    place_old_gram(K, old, reuse, rows=2)
    kept = [0, 2, 3]
    np.testing.assert_array_equal(K[np.ix_(kept, kept)], old[np.ix_([2, 0, 3], [2, 0, 3])])
    assert np.isnan(K[1]).all()
    blocks = [BlockRows("f", (0, 1, 2), (2, 0, 3)), BlockRows("g", (0,), (1,))]
    old_parts, new_parts = split_blocks(blocks, reuse.old < 0)
    assert [b.positions for b in old_parts] == [(2, 0, 3)] and [(b.file, b.positions) for b in new_parts] == [
        ("g", (1,))]


def test_a_solve_chained_from_the_last_ones_residuals_equals_a_fresh_solve():
    """The residuals a sharded solve leaves (exact at several u's, bounded elsewhere), extended by the new rows'
    residual at the prior's u, start the grown pool's solve: the same answer as a fresh one."""
    G, g = _clustered(700, 24, seed=3)
    n0 = 650
    gamma = 0.05 * float(np.max(np.abs(G @ g) / np.linalg.norm(G, axis=1)))
    shard = ShardPolicy(max_gather_bytes=8 * 24 * 400, start=64, min_growth=16)

    def op(X):
        return ShardedGradients(n=len(X), p=24, beta=X @ g, diag=np.einsum("ij,ij->i", X, X), times=lambda u: X @ u,
                                rows=lambda idx: X[idx])

    first = solve_sharded(op(G[:n0]), g, gamma=gamma, normalize="cosine", shard=shard)
    left = first.info["residuals"]
    s = 1 / np.linalg.norm(G, axis=1)
    new = np.arange(n0, len(G))
    residual = np.concatenate([left.residual, s[new] * (G[new] @ left.u_refs[-1]) - s[new] * (G[new] @ g)])
    ref = np.concatenate([left.ref, np.full(new.size, len(left.u_refs) - 1)])
    prior = Prior(w=np.concatenate([first.w, np.zeros(new.size)]), residual=residual, u_refs=left.u_refs, ref=ref)
    got = solve_sharded(op(G), g, gamma=gamma, normalize="cosine", shard=shard, prior=prior)
    want = solve_kmm_gradients(G, g, gamma=gamma, normalize="cosine")
    assert got.status == "optimal" and got.kkt <= 1e-9
    assert got.objective == pytest.approx(want.objective, rel=1e-9)
    np.testing.assert_allclose(got.w, want.w, atol=1e-7)
    assert got.info["sharded"]["prior"] in ("certified", "seeded")


@pytest.fixture(scope="module")
def three_nodes():
    """The three-node cluster of conftest.three_node_cluster for this module's tests."""
    yield from three_node_cluster(NODES)


def _write_pool(path, G: np.ndarray, names: list[str]) -> None:
    pq.write_table(pa.table({"group": names, "vector": [list(map(float, r)) for r in G.astype(np.float32)]}), path,
                   row_group_size=500)


def _score(tmp_path, pool: str, name: str, *extra: str) -> tuple[dict, np.ndarray]:
    from convalue.engine.driver.cli import main

    assert main(["score", str(tmp_path / pool), "--target", str(tmp_path / "target.npy"), "--gamma-ratio", "0.05",
                 "--out", str(tmp_path / "runs"), "--name", name, *extra]) == 0
    run_dir = tmp_path / "runs" / name
    summary = json.loads((run_dir / "summary.json").read_text())
    scores = {r["group"]: r["score"] for r in pq.read_table(run_dir / "scores.parquet").to_pylist()}
    return summary, np.array([scores[n] for n in summary["order"]])


@pytest.mark.parametrize("space", ["gram", "gradients"])
def test_score_values_a_grown_file_from_its_prior_as_from_scratch(three_nodes, tmp_path, space):
    """`convalue score` on a grown vector file, in the folder of its first valuation, imports only the new rows,
    computes only their Gram tiles (or, sharded, their statistics and residual) and gives a fresh run's scores."""
    G, g = _clustered(1200, 32, seed=9)
    names = [f"g{i:04d}" for i in range(len(G))]
    _write_pool(tmp_path / "pool.parquet", G[:1100], names[:1100])  # row groups of 500 rows
    np.save(tmp_path / "target.npy", g.astype(np.float32))
    extra = ["--space", space] + (["--max-gather-gb", str(8 * 32 * 700 / 2**30)] if space == "gradients" else [])
    first, _ = _score(tmp_path, "pool.parquet", "grow", *extra)
    _write_pool(tmp_path / "pool.parquet", G, names)  # the same file, 100 rows appended
    grown, w = _score(tmp_path, "pool.parquet", "grow", *extra)
    fresh, w_fresh = _score(tmp_path, "pool.parquet", "fresh", *extra)
    assert grown["order"] == fresh["order"] == names
    assert grown["gram"]["incremental"]["on_cluster"]  # a new row enters: the prior does not answer in the driver
    assert grown["gram"]["incremental"]["reused_rows"] == 1100 and grown["gram"]["incremental"]["new_rows"] == 100
    assert first["data"]["rows_decoded"] == 1100 and grown["data"]["rows_decoded"] < 1200  # unchanged row groups
    assert grown["solver"]["kkt"] <= 1e-9 and grown["solver"]["status"] == "optimal"
    assert grown["solver"]["objective"] == pytest.approx(fresh["solver"]["objective"], rel=1e-9)
    np.testing.assert_allclose(w, w_fresh, atol=1e-7)
    assert set(np.flatnonzero(w > 1e-8)) == set(np.flatnonzero(w_fresh > 1e-8))
    store = json.loads((tmp_path / "runs" / "grow" / "vectors" / "manifest.json").read_text())
    assert sum(len(b["groups"]) for b in store["blocks"]) == 1200 + 1  # the old rows were not imported again
    if space == "gram":
        K = np.load(tmp_path / "runs" / "grow" / "gram.npy")
        G64 = G.astype(np.float32).astype(np.float64)
        np.testing.assert_allclose(K, G64 @ G64.T, rtol=1e-10, atol=1e-10)
    else:
        assert grown["gram"]["sharded"]["held_rows"] <= 700
        assert grown["gram"]["sharded"]["blocks_loaded"] == 0  # the rows it needed were the ones the prior kept
        assert grown["gram"]["bytes_read"] < fresh["gram"]["bytes_read"] / 5  # the new rows' statistics only


def test_a_grown_pool_whose_support_moves_reads_its_stored_blocks_and_equals_a_fresh_valuation(three_nodes,
                                                                                               tmp_path):
    """Appended rows near the target enter the support: the prior only seeds the sharded solve, whose passes read
    the old rows' blocks from the run's store (left there until a product needs them), and the answer is a fresh
    valuation's."""
    G, g = _clustered(900, 16, seed=13)
    names = [f"g{i:03d}" for i in range(900)]
    np.save(tmp_path / "target.npy", g.astype(np.float32))
    _write_pool(tmp_path / "pool.parquet", G, names)  # row groups of 500 rows
    cap = ["--space", "gradients", "--max-gather-gb", str(8 * 16 * 300 / 2**30)]
    _score(tmp_path, "pool.parquet", "grow", *cap)
    near = g + 0.05 * np.random.default_rng(2).normal(size=(40, 16)) * np.linalg.norm(g) / 4
    _write_pool(tmp_path / "pool.parquet", np.vstack([G, near]), names + [f"new{i:02d}" for i in range(40)])
    grown, w = _score(tmp_path, "pool.parquet", "grow", *cap)
    fresh, w_fresh = _score(tmp_path, "pool.parquet", "fresh", *cap)
    assert grown["gram"]["incremental"]["on_cluster"] and grown["gram"]["incremental"]["prior"] != "certified"
    assert w[900:].any()  # the new rows are bought
    sharded = grown["gram"]["sharded"]
    assert sharded["passes"] >= 1 and sharded["blocks_loaded"] >= 1  # an old block, read from the store for a pass
    assert grown["solver"]["kkt"] <= 1e-9 and grown["solver"]["status"] == "optimal"
    assert grown["solver"]["objective"] == pytest.approx(fresh["solver"]["objective"], rel=1e-9)
    np.testing.assert_allclose(w, w_fresh, atol=1e-7)


def test_score_values_rows_the_prior_certifies_in_the_driver_alone(three_nodes, tmp_path):
    """Appended rows that stay unselected (unselected rows nearest orthogonal to the target, again and perturbed)
    leave the prior certified: the grown pool is valued from the new rows' blocks in the driver, no task on the
    cluster, and gives a fresh valuation's certified answer."""
    G, g = _clustered(600, 16, seed=12)
    names = [f"g{i:03d}" for i in range(600)]
    np.save(tmp_path / "target.npy", g.astype(np.float32))
    _write_pool(tmp_path / "pool.parquet", G, names)
    first, w1 = _score(tmp_path, "pool.parquet", "grow", "--space", "gradients")
    cos = np.abs(G @ g) / np.linalg.norm(G, axis=1)
    far = [i for i in np.argsort(cos) if w1[i] == 0][:30]
    grown = np.vstack([G, G[far] + 1e-4 * np.random.default_rng(1).normal(size=(30, 16))])
    grown_names = names + [f"new{i:02d}" for i in range(30)]
    _write_pool(tmp_path / "pool.parquet", grown, grown_names)
    again, w = _score(tmp_path, "pool.parquet", "grow", "--space", "gradients")
    fresh, w_fresh = _score(tmp_path, "pool.parquet", "fresh", "--space", "gradients")
    assert again["gram"]["incremental"] == {"reused_rows": 600, "new_rows": 30, "on_cluster": False,
                                            "prior": "certified"}
    assert "the driver (no Ray task)" in (tmp_path / "runs" / "grow" / "report.html").read_text()
    assert again["gram"]["tiles_per_node"] == {"driver": 1} and again["gram"]["sharded"]["passes"] == 0
    assert again["solver"]["kkt"] <= 1e-9 and again["solver"]["status"] == "optimal"
    assert again["solver"]["objective"] == pytest.approx(fresh["solver"]["objective"], rel=1e-9)
    np.testing.assert_allclose(w, w_fresh, atol=1e-7)
    assert set(np.flatnonzero(w > 1e-8)) == set(np.flatnonzero(w_fresh > 1e-8)) and not w[600:].any()
    # the state it leaves values the next growth the same way
    again2, _ = _score(tmp_path, "pool.parquet", "grow", "--space", "gradients")
    assert again2["gram"]["incremental"]["prior"] == "certified" and again2["gram"]["incremental"]["new_rows"] == 0


def test_score_again_on_an_unchanged_file_reuses_the_prior_as_it_is(three_nodes, tmp_path):
    G, g = _clustered(400, 16, seed=10)
    _write_pool(tmp_path / "pool.parquet", G, [f"g{i:03d}" for i in range(400)])
    np.save(tmp_path / "target.npy", g.astype(np.float32))
    first, w1 = _score(tmp_path, "pool.parquet", "same", "--space", "gradients")
    again, w2 = _score(tmp_path, "pool.parquet", "same", "--space", "gradients")
    assert again["gram"]["incremental"] == {"reused_rows": 400, "new_rows": 0, "prior": "certified",
                                            "on_cluster": False}  # valued in the driver: nothing to compute
    assert again["gram"]["sharded"]["blocks_loaded"] == 0 and again["gram"]["sharded"]["passes"] == 0
    np.testing.assert_array_equal(w1, w2)
    # --overwrite values afresh: every row read again, no prior, the same certified answer
    fresh, w3 = _score(tmp_path, "pool.parquet", "same", "--space", "gradients", "--overwrite")
    assert fresh["data"]["rows_decoded"] == 400 and "incremental" not in fresh["gram"]
    assert fresh["solver"]["objective"] == pytest.approx(first["solver"]["objective"], rel=1e-9)
    np.testing.assert_allclose(w3, w1, atol=1e-7)


def test_a_run_with_more_candidates_featurises_and_values_only_the_new_groups(three_nodes, tiny_model_dir,
                                                                                target_jsonl, tmp_path):
    from conftest import chatterbot_pairs

    from convalue.engine.config import config_from_dict
    from convalue.engine.driver.pipeline import run
    from convalue.engine.driver.resolve import stored_vectors
    from convalue.engine.files.folder import RunFolder
    from convalue.engine.selection.solve import SolveSpec

    rows = []
    for lang in ("english", "spanish", "german", "hindi", "italian"):
        rows += [r | {"group": lang} for r in chatterbot_pairs(lang, 6)]
    write_jsonl(tmp_path / "pool4.jsonl", [r for r in rows if r["group"] != "italian"])
    write_jsonl(tmp_path / "pool5.jsonl", rows)
    first = run(config_from_dict(tiny_run_config(tmp_path, tiny_model_dir, target_jsonl, tmp_path / "pool4.jsonl")))
    data = tiny_run_config(tmp_path, tiny_model_dir, target_jsonl, tmp_path / "pool5.jsonl")
    grown = run(config_from_dict(data))
    assert first.status == grown.status == "complete"
    assert grown.featurize["groups_computed"] == 1 and grown.featurize["groups_reused"] == 5  # with the target
    assert grown.gram["incremental"]["reused_rows"] == 4 and grown.gram["incremental"]["new_rows"] == 1
    folder = RunFolder.open(tmp_path / "runs" / "t")
    G, g = stored_vectors(folder, grown.order)
    spec = SolveSpec(gamma=data["solver"]["gamma"], normalize=data["solver"]["normalize"])
    w, _ = spec.scores(G, g)
    scores = {r["group"]: r["score"] for r in pq.read_table(tmp_path / "runs" / "t" / "scores.parquet").to_pylist()}
    np.testing.assert_allclose([scores[n] for n in grown.order], w, atol=1e-9)
    G64 = G.astype(np.float64)
    np.testing.assert_allclose(np.load(tmp_path / "runs" / "t" / "gram.npy"), G64 @ G64.T, rtol=1e-10, atol=1e-10)


@pytest.mark.bench  # runs a bench script: `make bench-check`, not `make test`
def test_the_incremental_bench_times_both_valuations_and_ends_with_json(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    bench = Path(__file__).parents[1] / "bench" / "incremental.py"
    out = subprocess.run([sys.executable, str(bench), "--n", "300", "--p", "16", "--grow", "0.05", "--gamma-ratio",
                          "0.05", "--space", "gradients", "--workdir", str(tmp_path)],
                         capture_output=True, text=True, check=True, timeout=900).stdout
    (row,) = json.loads(out.strip().splitlines()[-1])["results"]
    assert row["added"] == 15 and row["incremental"]["reused_rows"] == 300 and row["same_support"]
    assert row["objective_incremental"] == pytest.approx(row["objective_full"], rel=1e-9)
    assert row["full_s"] > 0 and row["incremental_s"] > 0 and row["max_abs_score_diff"] < 1e-7
