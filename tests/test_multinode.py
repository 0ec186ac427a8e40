"""The blocked Gram on a simulated three-node Ray cluster (ray.cluster_utils.Cluster): K equals the one-process
product, each tile runs on a node that holds its blocks, and a run on the cluster gives the embedded run's scores."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest
from conftest import three_node_cluster, tiny_run_config

pytestmark = pytest.mark.heavy  # whole runs: scheduled before the light modules (conftest.py)

NODES = ("node_a", "node_b", "node_c")


@pytest.fixture(scope="module")
def three_nodes():
    """The three-node cluster of conftest.three_node_cluster for this module's tests."""
    yield from three_node_cluster(NODES)


def test_tiles_run_where_their_blocks_live_and_equal_the_product(three_nodes):
    ray = three_nodes
    from convalue.actors.gram import build_gram
    from convalue.engine.selection.blocked import BlockRows

    @ray.remote(num_cpus=0)
    def block_on_this_node(seed: int, rows: int) -> tuple[str, np.ndarray]:
        X = np.random.default_rng(seed).normal(size=(rows, 64)).astype(np.float32)
        return ray.get_runtime_context().get_node_id(), X

    blocks, refs, parts, position = [], {}, [], 0
    for b in range(9):  # three blocks of 700 rows on each node
        node_ref, X_ref = block_on_this_node.options(resources={NODES[b % 3]: 0.01}, num_returns=2).remote(b, 700)
        node, file = ray.get(node_ref), f"block-{b}"
        refs[file] = X_ref
        blocks.append(BlockRows(file, tuple(range(700)), tuple(range(position, position + 700)), node, 700 * 64 * 4))
        parts.append(ray.get(X_ref))
        position += 700
    G = np.concatenate(parts).astype(np.float64)
    g = np.random.default_rng(99).normal(size=64)
    result = build_gram(blocks, refs, len(G), g, "euclidean")
    np.testing.assert_allclose(result.K, G @ G.T, rtol=1e-10, atol=1e-9)
    np.testing.assert_allclose(result.beta, G @ g, rtol=1e-10, atol=1e-9)
    detail = result.stats["tile_detail"]
    assert len(result.stats["tiles_per_node"]) == 3  # the work was spread over the three nodes
    for t in detail:  # each tile ran on a node holding its blocks: a diagonal tile moves nothing
        assert t["node"] in t["block_nodes"]
        if t["i"] == t["j"]:
            assert t["bytes_moved"] == 0
    assert 0 < result.stats["bytes_moved"] < result.stats["bytes_read"]


def test_a_run_on_the_cluster_scores_as_its_stored_vectors_say(three_nodes, tiny_model_dir, pool_jsonl, target_jsonl,
                                                               tmp_path):
    """Gradient workers on three nodes (those off the driver's node hand their blocks to the driver to store);
    the scores equal a one-process solve of the stored vectors."""
    from convalue.engine.config import config_from_dict
    from convalue.engine.driver.pipeline import run
    from convalue.engine.driver.resolve import stored_vectors
    from convalue.engine.files.folder import RunFolder
    from convalue.engine.selection.solve import SolveSpec

    data = tiny_run_config(tmp_path, tiny_model_dir, target_jsonl, pool_jsonl,
                           ray={"workers": 3, "cpus_per_worker": 1, "groups_per_call": 1})
    summary = run(config_from_dict(data))
    assert summary.status == "complete" and summary.gram["tiles"] >= 1
    folder = RunFolder.open(tmp_path / "runs" / "t")
    G, g = stored_vectors(folder, summary.order)
    spec = SolveSpec(gamma=data["solver"]["gamma"], normalize=data["solver"]["normalize"])
    w, beta = spec.scores(G, g)
    scores = {r["group"]: r for r in pq.read_table(tmp_path / "runs" / "t" / "scores.parquet").to_pylist()}
    np.testing.assert_allclose([scores[n]["score"] for n in summary.order], w, atol=1e-9)
    np.testing.assert_allclose([scores[n]["beta"] for n in summary.order], beta, rtol=1e-9)
