"""Seeded random projections of gradient vectors (inner products preserved in expectation)."""

from __future__ import annotations

from typing import Protocol

import numpy as np


class ProjectionError(ValueError):
    """A projection was mis-specified or applied to vectors of the wrong size."""


class Projector(Protocol):
    """Maps [B, dim_in] gradient rows to [B, dim_out]; the same (kind, dim, seed, dim_in) gives the same map anywhere."""

    kind: str
    dim_in: int
    dim_out: int
    seed: int

    def project(self, X: np.ndarray) -> np.ndarray: ...


class _Base:
    kind = "base"

    def __init__(self, dim_in: int, dim_out: int, seed: int):
        if dim_in <= 0:
            raise ProjectionError(f"dim_in must be > 0, got {dim_in}")
        if dim_out <= 0:
            raise ProjectionError(f"projection.dim must be > 0, got {dim_out}")
        self.dim_in, self.dim_out, self.seed = int(dim_in), int(dim_out), int(seed)

    def _check(self, X: np.ndarray) -> np.ndarray:
        X = np.atleast_2d(np.asarray(X, dtype=np.float32))
        if X.shape[1] != self.dim_in:
            raise ProjectionError(f"{self.kind} projector expects vectors of size {self.dim_in}, got {X.shape[1]}")
        return X

    def spec(self) -> dict:
        """Kind, dimensions and seed (recorded in the vector store's manifest)."""
        return {"kind": self.kind, "dim_in": self.dim_in, "dim_out": self.dim_out, "seed": self.seed}


class IdentityProjector(_Base):
    """No compression: p = d."""

    kind = "identity"

    def __init__(self, dim_in: int, dim_out: int | None = None, seed: int = 0):
        super().__init__(dim_in, dim_in, seed)

    def project(self, X: np.ndarray) -> np.ndarray:
        return self._check(X).copy()


class CountSketchProjector(_Base):
    """Sparse JL / CountSketch: coordinate j goes to bucket h(j) with sign s(j); O(d) per vector."""

    kind = "countsketch"

    def __init__(self, dim_in: int, dim_out: int, seed: int):
        super().__init__(dim_in, dim_out, seed)
        import scipy.sparse as sp

        rng = np.random.default_rng([seed, 0xC0DE])
        buckets = rng.integers(0, dim_out, size=dim_in)
        signs = rng.integers(0, 2, size=dim_in).astype(np.float32) * 2 - 1
        self._S = sp.csr_matrix((signs, (np.arange(dim_in), buckets)), shape=(dim_in, dim_out))

    def project(self, X: np.ndarray) -> np.ndarray:
        return np.asarray(self._S.T.dot(self._check(X).T).T, dtype=np.float32)


class RademacherProjector(_Base):
    """Dense +-1/sqrt(p) projection, generated block by block from the seed (never a d x p matrix in memory)."""

    kind = "rademacher"

    def __init__(self, dim_in: int, dim_out: int, seed: int, block_rows: int = 4096):
        super().__init__(dim_in, dim_out, seed)
        self.block_rows = block_rows

    def project(self, X: np.ndarray) -> np.ndarray:
        X = self._check(X)
        out = np.zeros((X.shape[0], self.dim_out), dtype=np.float64)
        scale = 1.0 / np.sqrt(self.dim_out)
        for b, start in enumerate(range(0, self.dim_in, self.block_rows)):
            stop = min(start + self.block_rows, self.dim_in)
            rng = np.random.default_rng([self.seed, 0xD5E, b])
            R = rng.integers(0, 2, size=(stop - start, self.dim_out), dtype=np.int8).astype(np.float32) * 2 - 1
            out += X[:, start:stop] @ R
        return (out * scale).astype(np.float32)


KINDS = {"identity": IdentityProjector, "countsketch": CountSketchProjector, "rademacher": RademacherProjector}


def make_projector(kind: str, dim_in: int, dim_out: int, seed: int) -> Projector:
    """Build the projector named by kind."""
    if kind not in KINDS:
        raise ProjectionError(f"projection.kind must be one of {sorted(KINDS)}, got {kind!r}")
    return KINDS[kind](dim_in, dim_out, seed)
