"""Anderson acceleration (type II) of a fixed-point iteration v <- T(v), as SCS applies it to its ADMM."""

from __future__ import annotations

import numpy as np


class Anderson:
    """Extrapolates v_{k+1} from the last `memory` differences of T's outputs and residuals (Walker and Ni 2011).

    On an affine map (ADMM once its support and signs hold) it is GMRES on the residual, so it needs far fewer
    iterations than the plain map; push() returns the plain step T(v) until two residuals are known.
    """

    def __init__(self, size: int, memory: int = 5):
        if memory < 1:
            raise ValueError(f"memory must be >= 1, got {memory}")
        self.memory = memory
        self._dF = np.empty((size, memory))  # residual differences, a ring buffer
        self._dT = np.empty((size, memory))  # differences of T's outputs
        self._last: tuple[np.ndarray, np.ndarray] | None = None
        self._count = 0

    def reset(self) -> None:
        """Forget the history (the map changed)."""
        self._last, self._count = None, 0

    def push(self, v: np.ndarray, tv: np.ndarray) -> np.ndarray:
        """The next iterate, given the current one v and the map's output T(v)."""
        f = tv - v
        if self._last is not None:
            j = self._count % self.memory
            self._dF[:, j] = f - self._last[0]
            self._dT[:, j] = tv - self._last[1]
            self._count += 1
        self._last = (f, tv)
        m = min(self._count, self.memory)
        if m == 0:
            return tv
        dF = self._dF[:, :m]
        gram = dF.T @ dF
        # a tiny Tikhonov term keeps the m x m system solvable when differences are (nearly) collinear
        gram[np.diag_indices(m)] += 1e-12 * max(float(np.trace(gram)), 1e-300)
        coef = np.linalg.solve(gram, dF.T @ f)
        return tv - self._dT[:, :m] @ coef
