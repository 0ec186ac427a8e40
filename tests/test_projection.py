"""Projection: seeded, unbiased in expectation, the same in every process, streamed as cached."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from convalue.engine.features.projection import ProjectionError, make_projector


@pytest.mark.parametrize("kind", ["countsketch", "rademacher", "gaussian"])
def test_inner_products_preserved_in_expectation(kind):
    rng = np.random.default_rng(0)
    d, p = 2000, 64
    x, y = rng.normal(size=d), rng.normal(size=d)
    y = 0.6 * x + 0.8 * y  # correlated pair
    est = []
    for seed in range(300):
        P = make_projector(kind, d, p, seed)
        px, py = P.project(np.stack([x, y]))
        est.append(float(px @ py))
    exact = float(x @ y)
    se = np.std(est) / np.sqrt(len(est))
    assert abs(np.mean(est) - exact) < 4 * se
    assert np.std(est) < abs(exact)  # single draws are informative at p = 64


def test_identity_is_exact_and_bad_dims_raise():
    X = np.arange(12, dtype=np.float32).reshape(2, 6)
    assert np.array_equal(make_projector("identity", 6, 6, 0).project(X), X)
    with pytest.raises(ProjectionError, match="projection.dim must be > 0"):
        make_projector("countsketch", 10, 0, 0)
    with pytest.raises(ProjectionError, match="expects vectors of size 10"):
        make_projector("countsketch", 10, 4, 0).project(np.ones((1, 9)))
    with pytest.raises(ProjectionError, match="must be one of"):
        make_projector("fourier", 10, 4, 0)


def test_streamed_countsketch_equals_the_cached_one():
    """Large inputs (full-model gradients) hash block by block instead of holding a d-sized matrix: same map."""
    from convalue.engine.features.projection import CountSketchProjector

    X = np.random.default_rng(3).normal(size=(3, 4500)).astype(np.float32)
    cached = CountSketchProjector(4500, 64, 5, block=1000)
    streamed = CountSketchProjector(4500, 64, 5, block=1000, cache_limit=0)
    assert cached._S is not None and streamed._S is None
    np.testing.assert_allclose(streamed.project(X), cached.project(X), rtol=1e-5, atol=1e-5)


SCRIPT = """
import numpy as np, sys
from convalue.engine.features.projection import make_projector
x = np.random.default_rng(7).normal(size=(2, 5000)).astype(np.float32)
print(repr(make_projector(sys.argv[1], 5000, 128, 42).project(x).tolist()))
"""


@pytest.mark.parametrize("kind", ["countsketch", "rademacher", "gaussian"])
def test_same_seed_same_vector_in_two_processes(kind):
    outs = [subprocess.run([sys.executable, "-c", SCRIPT, kind], capture_output=True, text=True, check=True).stdout
            for _ in range(2)]
    assert outs[0] == outs[1] and len(outs[0]) > 100
    x = np.random.default_rng(7).normal(size=(2, 5000)).astype(np.float32)
    assert repr(make_projector(kind, 5000, 128, 42).project(x).tolist()) == outs[0].strip()
    assert not np.allclose(make_projector(kind, 5000, 128, 43).project(x), eval(outs[0]))
