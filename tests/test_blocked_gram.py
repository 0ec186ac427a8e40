"""The blocked Gram: panels of stored blocks, tile tasks K_ij = X_i X_j^T and beta in the run's metric, assembled to
equal the single-process product; only the rows a run uses, in its order."""

from __future__ import annotations

import socket

import numpy as np
import pytest

from convalue.engine.selection.blocked import (
    BlockRows,
    assemble,
    gather_float64,
    panels_of,
    stack_rows,
    tile,
)
from convalue.engine.selection.gram import cosine, diag_fisher_vectors


def _blocks(G: np.ndarray, sizes: list[int], seed: int = 0):
    """G's rows cut into blocks of `sizes` rows in a shuffled order, each block with a stray row the run does not
    use: (block arrays by file, BlockRows)."""
    order = np.random.default_rng(seed).permutation(len(G))
    arrays, rows, start = {}, [], 0
    for b, size in enumerate(sizes):
        pos = order[start:start + size]
        start += size
        stray = np.full((1, G.shape[1]), 1e6, np.float32)  # e.g. a group of an earlier run in the same block
        arrays[f"block-{b}"] = np.concatenate([stray, G[pos]])
        rows.append(BlockRows(f"block-{b}", tuple(range(1, size + 1)), tuple(int(p) for p in pos),
                              nbytes=arrays[f"block-{b}"].nbytes))
    return arrays, rows


@pytest.mark.parametrize("metric", ["euclidean", "diag_fisher"])
def test_tiles_assemble_to_the_single_product(metric):
    rng = np.random.default_rng(1)
    G = rng.normal(size=(23, 16)).astype(np.float32)
    g = rng.normal(size=16)
    arrays, blocks = _blocks(G, [4, 4, 4, 3, 4, 4])
    panels = panels_of(blocks, panel_rows=9)
    assert len(panels) == 3 and sorted(np.concatenate([p.positions for p in panels])) == list(range(23))
    G64 = G.astype(np.float64)
    if metric == "diag_fisher":
        Gm, gm, M = diag_fisher_vectors(G64, g)
        root = np.sqrt(M)
    else:
        Gm, gm, root = G64, g, None
    tiles = []
    for i, pi in enumerate(panels):
        Xi = stack_rows([arrays[b.file] for b in pi.blocks], pi.blocks)
        tiles.append(tile(i, i, Xi, None, g, root))
        for j in range(i + 1, len(panels)):
            pj = panels[j]
            tiles.append(tile(i, j, Xi, stack_rows([arrays[b.file] for b in pj.blocks], pj.blocks), g, root))
    result = assemble(len(G), panels, tiles, g)
    np.testing.assert_allclose(result.K, Gm @ Gm.T, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(result.beta, Gm @ gm, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(result.cosine, cosine(G, g), rtol=1e-10)
    np.testing.assert_allclose(result.row_norm2, np.einsum("ij,ij->i", G64, G64), rtol=1e-12)
    assert result.stats["tiles"] == 6 and result.stats["panels"] == 3
    G_run = gather_float64(len(G), panels, [arrays[b.file] for p in panels for b in p.blocks])
    assert G_run.dtype == np.float64 and np.array_equal(G_run, G64)  # the run's rows, in its order, no stray row


def test_build_gram_on_ray_equals_the_product_and_gathers_the_vectors(ray_session):
    import ray

    from convalue.actors.gram import build_gram, gather_rows

    rng = np.random.default_rng(2)
    G = rng.normal(size=(31, 12)).astype(np.float32)
    g = rng.normal(size=12)
    arrays, blocks = _blocks(G, [5, 5, 5, 5, 5, 6])
    refs = {f: ray.put(a) for f, a in arrays.items()}
    result = build_gram(blocks, refs, len(G), g, "euclidean")
    G64 = G.astype(np.float64)
    np.testing.assert_allclose(result.K, G64 @ G64.T, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(result.beta, G64 @ g, rtol=1e-10)
    here = ray.get_runtime_context().get_node_id()  # the tiles ran on the test's one node, named by its address
    node = result.stats["nodes"][here]
    assert list(result.stats["nodes"]) == list(result.stats["tiles_per_node"]) == [here]
    assert node["driver"] and node["host"] == socket.gethostname() and len(node["ip"].split(".")) == 4
    no_K = build_gram(blocks, refs, len(G), g, "diag_fisher", with_K=False)
    Gm, gm, M = diag_fisher_vectors(G64, g)
    assert no_K.K is None and no_K.stats["tiles"] == no_K.stats["panels"]
    np.testing.assert_allclose(no_K.beta, Gm @ gm, rtol=1e-10)
    np.testing.assert_allclose(no_K.M, M, rtol=1e-12)
    panels = panels_of(blocks)
    gathered = ray.get(gather_rows.remote(len(G), panels, *[refs[b.file] for p in panels for b in p.blocks]))
    np.testing.assert_array_equal(gathered, G)


@pytest.mark.parametrize("metric", ["euclidean", "diag_fisher"])
def test_the_solver_actor_solves_the_stored_blocks_as_the_library_does(ray_session, metric):
    """The gradient-space solve on a SolverActor (G gathered there in float64, the metric and the cosine applied in
    place) reaches the certified optimum of the single-process problem, and leaves the stored blocks as they were."""
    import ray

    from convalue.actors.solver import solve_blocks_on_actor
    from convalue.engine.selection.solve import SolveSpec

    rng = np.random.default_rng(5)
    G = rng.normal(size=(40, 64)).astype(np.float32)
    g = rng.normal(size=64)
    arrays, blocks = _blocks(G, [8, 8, 8, 8, 8])
    before = {f: a.copy() for f, a in arrays.items()}
    refs = {f: ray.put(a) for f, a in arrays.items()}
    spec = SolveSpec(gamma_ratio=0.05, normalize="cosine", metric=metric, space="gradients")
    got = solve_blocks_on_actor(spec, blocks, refs, len(G), g)
    want = spec.solve(spec.problem(G, g))
    assert got.status == want.status == "optimal" and got.kkt <= 1e-9
    assert got.objective == pytest.approx(want.objective, rel=1e-9, abs=1e-12)
    assert got.gamma == pytest.approx(want.gamma, rel=1e-12)
    assert set(np.flatnonzero(got.w > 1e-8)) == set(np.flatnonzero(want.w > 1e-8))
    assert all(np.array_equal(ray.get(refs[f]), before[f]) for f in arrays)
