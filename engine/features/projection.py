"""Seeded random projections of gradient vectors (inner products preserved in expectation)."""

from __future__ import annotations

from typing import Protocol

import numpy as np

from convalue.engine.config.fields import ConfigError


class ProjectionError(ValueError):
    """A projection was mis-specified or applied to vectors of the wrong size."""


class Projector(Protocol):
    """Maps [B, dim_in] gradient rows to [B, dim_out]; the same (kind, dim, seed, dim_in) gives the same map anywhere."""

    kind: str
    dim_in: int
    dim_out: int
    seed: int

    def project(self, X: np.ndarray) -> np.ndarray:
        """The [B, dim_out] float32 projections of the [B, dim_in] rows of X."""
        ...


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
    """Sparse JL / CountSketch: coordinate j goes to bucket h(j) with sign s(j); O(d) per vector.

    The hash is drawn block by block from the seed, so a full-model gradient (d ~ 1e8) never needs a
    d-sized hash table: small inputs keep one sparse matrix, large ones regenerate each block per call.
    """

    kind = "countsketch"

    def __init__(self, dim_in: int, dim_out: int, seed: int, *, block: int = 1 << 22, cache_limit: int = 1 << 24):
        """block: input coordinates hashed at a time; cache_limit: the largest dim_in kept as one sparse matrix."""
        super().__init__(dim_in, dim_out, seed)
        self.block, self.cache_limit = block, cache_limit
        self._S = None
        if dim_in <= self.cache_limit:
            # SciPy: only when a sparse projector caches its matrix
            import scipy.sparse as sp

            buckets, signs = zip(*(self._hash(b) for b in range(self._n_blocks())))
            buckets, signs = np.concatenate(buckets), np.concatenate(signs)
            self._S = sp.csr_matrix((signs, (np.arange(dim_in), buckets)), shape=(dim_in, dim_out))

    def _n_blocks(self) -> int:
        return -(-self.dim_in // self.block)

    def _hash(self, b: int) -> tuple[np.ndarray, np.ndarray]:
        n = min(self.block, self.dim_in - b * self.block)
        rng = np.random.default_rng([self.seed, 0xC0DE, b])
        return rng.integers(0, self.dim_out, size=n), rng.integers(0, 2, size=n).astype(np.float32) * 2 - 1

    def project(self, X: np.ndarray) -> np.ndarray:
        X = self._check(X)
        if self._S is not None:
            return np.asarray(self._S.T.dot(X.T).T, dtype=np.float32)
        out = np.zeros((X.shape[0], self.dim_out), dtype=np.float64)
        for b in range(self._n_blocks()):
            buckets, signs = self._hash(b)
            part = X[:, b * self.block : b * self.block + len(buckets)]
            for r in range(X.shape[0]):
                out[r] += np.bincount(buckets, weights=part[r] * signs, minlength=self.dim_out)
        return out.astype(np.float32)


class _DenseBlocked(_Base):
    """A dense d x p matrix generated block by block from the seed (never held whole); p^(-1/2) scaling."""

    def __init__(self, dim_in: int, dim_out: int, seed: int, block_rows: int = 4096):
        super().__init__(dim_in, dim_out, seed)
        self.block_rows = block_rows

    def _block(self, rng: np.random.Generator, rows: int) -> np.ndarray:
        raise NotImplementedError

    def project(self, X: np.ndarray) -> np.ndarray:
        X = self._check(X)
        out = np.zeros((X.shape[0], self.dim_out), dtype=np.float64)
        for b, start in enumerate(range(0, self.dim_in, self.block_rows)):
            stop = min(start + self.block_rows, self.dim_in)
            out += X[:, start:stop] @ self._block(np.random.default_rng([self.seed, self.salt, b]), stop - start)
        return (out / np.sqrt(self.dim_out)).astype(np.float32)


class RademacherProjector(_DenseBlocked):
    """Dense +-1/sqrt(p) projection, applied in blocks."""

    kind = "rademacher"
    salt = 0xD5E

    def _block(self, rng: np.random.Generator, rows: int) -> np.ndarray:
        return rng.integers(0, 2, size=(rows, self.dim_out), dtype=np.int8).astype(np.float32) * 2 - 1


class GaussianProjector(_DenseBlocked):
    """Dense N(0, 1/p) projection, applied in blocks."""

    kind = "gaussian"
    salt = 0x6A55

    def _block(self, rng: np.random.Generator, rows: int) -> np.ndarray:
        return rng.standard_normal(size=(rows, self.dim_out), dtype=np.float32)


KINDS = {"identity": IdentityProjector, "countsketch": CountSketchProjector, "rademacher": RademacherProjector,
         "gaussian": GaussianProjector}


def make_projector(kind: str, dim_in: int, dim_out: int, seed: int) -> Projector:
    """Build the projector named by kind; one to more dimensions than its input is refused (it adds nothing but
    memory and work: a projection.dim above the featurised parameter count is a mistake in the config)."""
    if kind not in KINDS:
        raise ProjectionError(f"projection.kind must be one of {sorted(KINDS)}, got {kind!r}")
    check_projection_fits(kind, dim_in, dim_out)
    return KINDS[kind](dim_in, dim_out, seed)


def check_projection_fits(kind: str, dim_in: int, dim_out: int) -> None:
    """Refuse a projection to more dimensions than the dim_in parameters featurised (the driver asks before any
    worker starts, from the checkpoint's shapes; every replica asks again of its live model)."""
    if kind != "identity" and dim_out > dim_in > 0:
        raise ConfigError(f"is larger than the {dim_in} parameters featurised: a projection cannot add dimensions; "
                          f"use a dim of at most {dim_in}, or kind `identity`", field="projection.dim", value=dim_out)
