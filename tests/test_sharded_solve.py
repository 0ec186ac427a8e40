"""The sharded gradient-space solve: G reached only through G u and G[rows] products gives solve_kmm_gradients'
certified answer (objective, KKT, support) with no more of G held than its policy allows; on a three-node Ray
cluster the products run where the blocks live, and `convalue score` routes a G larger than the policy to it."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import three_node_cluster

from convalue.solvers import KMMSolveError, solve_kmm_gradients
from convalue.solvers.sharded import Prior, ShardedGradients, ShardPolicy, solve_sharded

pytestmark = pytest.mark.heavy  # whole runs: scheduled before the light modules (conftest.py)

NODES = ("node_a", "node_b", "node_c")


def _clustered(n: int, p: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """n rows around n // 10 cluster centres (near-duplicates, as gradients of similar groups are) and a target
    mixing three centres."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(max(2, n // 10), p))
    G = centres[rng.integers(0, len(centres), n)] + 0.3 * rng.normal(size=(n, p))
    return G, centres[0] + 0.5 * centres[1] - 0.3 * centres[2] + 0.1 * rng.normal(size=p)


class Counted:
    """numpy callables over G that record what they were asked for."""

    def __init__(self, G: np.ndarray, g: np.ndarray):
        self.G, self.passes, self.rows_read = G, 0, 0
        self.op = ShardedGradients(n=len(G), p=G.shape[1], beta=G @ g, diag=np.einsum("ij,ij->i", G, G),
                                   times=self.times, rows=self.rows)

    def times(self, u: np.ndarray) -> np.ndarray:
        self.passes += 1
        return self.G @ u

    def rows(self, idx: np.ndarray) -> np.ndarray:
        assert np.all(np.diff(idx) > 0)  # sorted, distinct: the shards are asked for each row once
        self.rows_read += idx.size
        return self.G[idx]


def _same_answer(got, want, gamma_rel: float = 1e-9) -> None:
    assert got.status == want.status == "optimal" and got.kkt <= 1e-9
    assert got.objective == pytest.approx(want.objective, rel=gamma_rel, abs=1e-12)
    assert set(np.flatnonzero(np.abs(got.w) > 1e-8)) == set(np.flatnonzero(np.abs(want.w) > 1e-8))
    np.testing.assert_allclose(got.w, want.w, atol=1e-7)


@pytest.mark.parametrize("ratio", [0.05, 0.002])
def test_a_sharded_solve_reaches_the_gradient_solvers_answer_holding_a_share_of_G(ratio):
    G, g = _clustered(600, 24, seed=1)
    counted = Counted(G, g)
    norms = np.sqrt(counted.op.diag)
    gamma = ratio * float(np.max(np.abs(counted.op.beta) / norms))
    shard = ShardPolicy(max_gather_bytes=8 * 24 * 400, start=64, min_growth=16)  # at most 400 of 600 rows
    got = solve_sharded(counted.op, g, gamma=gamma, normalize="cosine", shard=shard)
    want = solve_kmm_gradients(G, g, gamma=gamma, normalize="cosine")
    _same_answer(got, want)
    record = got.info["sharded"]
    assert record["held_rows"] <= 400 and record["held_bytes"] <= shard.max_gather_bytes
    assert got.method == "sharded_gradients" and record["rounds"][-1]["violators"] == 0


def test_the_budget_form_and_prices_are_solved_as_the_gradient_solver_does():
    G, g = _clustered(300, 16, seed=2)
    costs = np.random.default_rng(3).uniform(0.5, 2.0, len(G))
    shard = ShardPolicy(max_gather_bytes=8 * 16 * 200, start=32, min_growth=16)
    got = solve_sharded(Counted(G, g).op, g, budget=1.5, costs=costs, shard=shard)
    want = solve_kmm_gradients(G, g, budget=1.5, costs=costs)
    _same_answer(got, want)
    assert got.form == "budget" and float(costs @ np.abs(got.w)) == pytest.approx(1.5, rel=1e-9)


def test_a_prior_that_still_certifies_is_the_answer_without_reading_G():
    """An earlier pool's answer, zeros for new candidates far from the target, certifies on the grown pool from its
    known residual: no pass over G, no row read."""
    G, g = _clustered(400, 20, seed=4)
    gamma = 0.05 * float(np.max(np.abs(G @ g) / np.linalg.norm(G, axis=1)))
    old = solve_kmm_gradients(G[:380], g, gamma=gamma, normalize="cosine")
    G_new = G.copy()
    G_new[380:] -= np.outer(G_new[380:] @ g / (g @ g), g)  # the new rows are orthogonal to the target
    G_new[380:] *= 0.1
    counted = Counted(G_new, g)
    s = 1 / np.sqrt(counted.op.diag)
    Gs = G_new * s[:, None]
    w0 = np.concatenate([old.w, np.zeros(20)])
    u0 = w0 @ Gs
    prior = Prior(w=w0, residual=Gs @ u0 - s * counted.op.beta, u_refs=u0[None])
    got = solve_sharded(counted.op, g, gamma=gamma, normalize="cosine", prior=prior)
    want = solve_kmm_gradients(G_new, g, gamma=gamma, normalize="cosine")
    _same_answer(got, want)
    assert got.info["sharded"]["prior"] == "certified" and counted.passes == counted.rows_read == 0


def test_a_prior_that_no_longer_certifies_seeds_the_working_set():
    G, g = _clustered(400, 20, seed=5)
    gamma = 0.05 * float(np.max(np.abs(G @ g) / np.linalg.norm(G, axis=1)))
    old = solve_kmm_gradients(G[:360], g, gamma=gamma, normalize="cosine")
    G[360:] = G[360:] + 2.0 * g  # new rows close to the target: they must join the support
    counted = Counted(G, g)
    s = 1 / np.sqrt(counted.op.diag)
    w0 = np.concatenate([old.w, np.zeros(40)])
    u0 = w0 @ (G * s[:, None])
    prior = Prior(w=w0, residual=(G * s[:, None]) @ u0 - s * counted.op.beta, u_refs=u0[None])
    got = solve_sharded(counted.op, g, gamma=gamma, normalize="cosine", prior=prior)
    want = solve_kmm_gradients(G, g, gamma=gamma, normalize="cosine")
    _same_answer(got, want)
    assert got.info["sharded"]["prior"] == "seeded" and np.count_nonzero(got.w[360:]) > 0


def test_a_working_set_the_policy_cannot_hold_is_refused_naming_the_policy():
    G, g = _clustered(400, 40, seed=6)
    gamma = 1e-4 * float(np.max(np.abs(G @ g) / np.linalg.norm(G, axis=1)))
    with pytest.raises(KMMSolveError, match="max_gather_bytes"):
        solve_sharded(Counted(G, g).op, g, gamma=gamma, normalize="cosine",
                      shard=ShardPolicy(max_gather_bytes=8 * 40 * 30, start=16, min_growth=8))


def test_a_full_working_set_sheds_its_far_inside_zeros_and_still_certifies():
    """At a cap of 42 rows (about twice the support), a solve that keeps every row it gathered runs out of room;
    one that lets W's zeros with |r_i| < prune_below lambda go first reaches the gradient solver's answer."""
    G, g = _clustered(600, 24, seed=0)
    gamma = 0.05 * float(np.max(np.abs(G @ g) / np.linalg.norm(G, axis=1)))
    cap = 8 * 24 * 42
    with pytest.raises(KMMSolveError, match="max_gather_bytes"):
        solve_sharded(Counted(G, g).op, g, gamma=gamma, normalize="cosine",
                      shard=ShardPolicy(max_gather_bytes=cap, start=16, min_growth=16, prune_below=0.0))
    got = solve_sharded(Counted(G, g).op, g, gamma=gamma, normalize="cosine",
                        shard=ShardPolicy(max_gather_bytes=cap, start=16, min_growth=16))
    _same_answer(got, solve_kmm_gradients(G, g, gamma=gamma, normalize="cosine"))
    assert got.info["sharded"]["held_rows"] <= 42


@pytest.fixture(scope="module")
def three_nodes():
    """The three-node cluster of conftest.three_node_cluster for this module's tests."""
    yield from three_node_cluster(NODES)


def test_products_run_where_the_blocks_live_and_give_the_one_process_answer(three_nodes):
    ray = three_nodes
    from convalue.actors.sharded import problem_of, solve_sharded_on_actor
    from convalue.engine.selection.blocked import BlockRows, GramResult, panels_of
    from convalue.engine.selection.solve import SolveSpec

    G, g = _clustered(900, 32, seed=7)
    G32 = G.astype(np.float32)

    @ray.remote(num_cpus=0)
    def block_on_this_node(rows: np.ndarray) -> tuple[str, np.ndarray]:
        return ray.get_runtime_context().get_node_id(), rows

    blocks, refs = [], {}
    for b in range(9):  # blocks of 100 rows, three on each node
        node_ref, X_ref = block_on_this_node.options(resources={NODES[b % 3]: 0.01}, num_returns=2).remote(
            G32[b * 100:(b + 1) * 100])
        refs[f"block-{b}"] = X_ref
        blocks.append(BlockRows(f"block-{b}", tuple(range(100)), tuple(range(b * 100, (b + 1) * 100)),
                                ray.get(node_ref), 100 * 32 * 4))
    G64 = G32.astype(np.float64)
    beta, diag = G64 @ g, np.einsum("ij,ij->i", G64, G64)
    gram = GramResult(K=None, beta=beta, cosine=np.zeros(900), row_norm2=diag, M=None, diag=diag)
    spec = SolveSpec(gamma_ratio=0.05, normalize="cosine", space="gradients")
    shard = ShardPolicy(max_gather_bytes=8 * 32 * 300, start=64, min_growth=32)
    sol, stats, kept = solve_sharded_on_actor(problem_of(spec, 900, g, gram, shard),
                                              panels_of(blocks, panel_rows=200), refs)
    want = spec.resolved(beta, diag).solve_vectors(G64, g)
    _same_answer(sol, want)
    assert len(stats["tasks_per_node"]) == 3 and stats["bytes_moved"] == 0  # every product ran beside its blocks
    assert len(stats["block_bytes_per_node"]) == 3 and sol.info["sharded"]["held_rows"] <= 300
    support = np.flatnonzero(sol.w)  # the rows a valuation keeps for the next: the support first, as stored
    assert set(support) <= set(kept.at) and np.array_equal(kept.rows[np.searchsorted(kept.at, support)], G32[support])


def test_convalue_score_solves_a_G_beyond_the_policy_in_its_shards(three_nodes, tmp_path):
    from convalue.engine.driver.cli import main

    G, g = _clustered(1500, 24, seed=8)
    pq.write_table(pa.table({"group": [f"g{i:04d}" for i in range(1500)],
                             "vector": [list(map(float, r)) for r in G.astype(np.float32)]}), tmp_path / "pool.parquet")
    np.save(tmp_path / "target.npy", g.astype(np.float32))
    runs = {}
    for name, extra in (("gathered", []), ("sharded", ["--max-gather-gb", str(8 * 24 * 600 / 2**30)])):
        assert main(["score", str(tmp_path / "pool.parquet"), "--target", str(tmp_path / "target.npy"),
                     "--gamma-ratio", "0.05", "--space", "gradients", "--out", str(tmp_path / "runs"), "--name", name,
                     *extra]) == 0
        run_dir = tmp_path / "runs" / name
        summary = json.loads((run_dir / "summary.json").read_text())
        scores = {r["group"]: r["score"] for r in pq.read_table(run_dir / "scores.parquet").to_pylist()}
        runs[name] = (summary, np.array([scores[n] for n in summary["order"]]))
    (gathered, w_g), (sharded, w_s) = runs["gathered"], runs["sharded"]
    assert "sharded" not in gathered["gram"] and sharded["gram"]["sharded"]["held_rows"] <= 600
    assert sharded["solver"]["method"] == "sharded_gradients" and sharded["solver"]["kkt"] <= 1e-9
    assert sharded["solver"]["objective"] == pytest.approx(gathered["solver"]["objective"], rel=1e-9)
    np.testing.assert_allclose(w_s, w_g, atol=1e-7)


@pytest.mark.bench  # runs a bench script: `make bench-check`, not `make test`
def test_the_scale_bench_runs_on_simulated_nodes_and_reports_each_ones_peak(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    bench = Path(__file__).parents[1] / "bench" / "scale.py"
    out = subprocess.run([sys.executable, str(bench), "--n", "1500", "--p", "16", "--gamma-ratio", "0.05",
                          "--space", "gradients", "--nodes", "2", "--node-store-gb", "0.1", "--node-memory-gb", "0.5", "--max-gather-gb",
                          str(8 * 16 * 600 / 2**30), "--workdir", str(tmp_path)],
                         capture_output=True, text=True, check=True, timeout=900).stdout
    figures = json.loads(out.strip().splitlines()[-1])
    (row,) = figures["results"]
    assert row["status"] == "complete" and row["nodes"] == 2 and len(row["node_peak_gb"]) == 2
    assert row["method"] == "sharded_gradients" and row["kkt"] < 1e-9 and row["driver_peak_gb"] > 0
    assert row["peak_pss_gb"] >= max(row["node_peak_gb"]) and figures["node_limits"]["node_store_gb"] == 0.1
    assert len(row["sharded"]["block_bytes_per_node"]) == 2  # the blocks were spread over both nodes
