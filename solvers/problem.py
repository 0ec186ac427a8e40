"""The KMM problem (paper eq. kmm_l1_penalized / kmm_qp) and its input validation."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


class KMMInputError(ValueError):
    """Raised when K, beta or the solver settings are not a valid KMM problem."""


class KMMSolveError(RuntimeError):
    """Raised when a solver does not reach an optimal solution."""


@dataclass(frozen=True)
class KMMProblem:
    """min_w 0.5 w'Kw - beta'w + gamma ||w||_1 (penalised) or s.t. ||w||_1 <= budget (budget form)."""

    K: np.ndarray
    beta: np.ndarray
    gamma: float | None = None
    budget: float | None = None

    @property
    def form(self) -> str:
        """'penalised' or 'budget'."""
        return "penalised" if self.gamma is not None else "budget"

    @property
    def n(self) -> int:
        """Number of candidates N."""
        return int(self.beta.shape[0])

    def objective(self, w: np.ndarray) -> float:
        """Objective value at w (the l1 term is included only in the penalised form)."""
        quad = 0.5 * float(w @ (self.K @ w)) - float(self.beta @ w)
        if self.gamma is not None:
            quad += self.gamma * float(np.abs(w).sum())
        return quad


def make_problem(
    K: np.ndarray,
    beta: np.ndarray,
    *,
    gamma: float | None = None,
    budget: float | None = None,
    normalize: str = "none",
    sym_tol: float = 1e-6,
    psd_tol: float = 1e-6,
) -> KMMProblem:
    """Validate K, beta and settings and return a float64 KMMProblem (optionally cosine-normalised)."""
    if (gamma is None) == (budget is None):
        raise KMMInputError("give exactly one of gamma (penalised form) or budget (||w||_1 <= budget)")
    if gamma is not None and not (np.isfinite(gamma) and gamma >= 0):
        raise KMMInputError(f"gamma must be a finite number >= 0, got {gamma!r}")
    if budget is not None and not (np.isfinite(budget) and budget > 0):
        raise KMMInputError(f"budget must be a finite number > 0, got {budget!r}")
    if normalize not in ("none", "cosine"):
        raise KMMInputError(f"normalize must be 'none' or 'cosine', got {normalize!r}")
    K = np.asarray(K, dtype=np.float64)
    beta = np.asarray(beta, dtype=np.float64)
    if K.ndim != 2 or K.shape[0] != K.shape[1]:
        raise KMMInputError(f"K must be a square matrix, got shape {K.shape}")
    if beta.ndim != 1 or beta.shape[0] != K.shape[0]:
        raise KMMInputError(f"beta must be a vector of length N={K.shape[0]}, got shape {beta.shape}")
    if K.shape[0] == 0:
        raise KMMInputError("K is empty: there are no candidates to value")
    if not np.all(np.isfinite(K)):
        raise KMMInputError("K contains NaN or inf")
    if not np.all(np.isfinite(beta)):
        raise KMMInputError("beta contains NaN or inf")
    scale = max(float(np.abs(K).max()), 1e-300)
    asym = float(np.abs(K - K.T).max())
    if asym > sym_tol * scale:
        raise KMMInputError(f"K is not symmetric: max |K - K^T| = {asym:.3g} (tolerance {sym_tol * scale:.3g})")
    K = 0.5 * (K + K.T)
    diag = np.diag(K)
    zero = np.flatnonzero(diag <= 1e-12 * scale)
    if zero.size:
        raise KMMInputError(
            f"{zero.size} candidate(s) have a zero-norm gradient (K_ii = 0), first at index {int(zero[0])}; "
            "drop them or check that their examples have response tokens"
        )
    lam_min = float(np.linalg.eigvalsh(K)[0])
    if lam_min < -psd_tol * scale:
        raise KMMInputError(
            f"K is not positive semidefinite: most negative eigenvalue {lam_min:.3g} (tolerance {-psd_tol * scale:.3g})"
        )
    if normalize == "cosine":
        d = np.sqrt(diag)
        K = K / np.outer(d, d)
        beta = beta / d
    return KMMProblem(K=K, beta=beta, gamma=None if gamma is None else float(gamma),
                      budget=None if budget is None else float(budget))
