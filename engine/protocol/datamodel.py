"""DataModel baselines (paper App. "DataModel"): which subsets to fine-tune, then an l1 fit of their utilities.

The design (uniform, eq. uniform_design, or compressed sensing, eqs. cs_design and cs_two_subsets) is a pure
function of N and a seed that lists the subsets to train; the driver fine-tunes theta_S = FT(theta_0, D_tar + S)
for each and measures a utility (higher is better, e.g. u(S) = L_val(target only) - L_val(S)); `fit_datamodel`
then solves the LASSO of eq. datamodel_lasso and returns one score w_i per candidate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

#: the paper's post-training budget: 10 N fine-tunes in all (App. "Baseline hyperparameters")
RUNS_PER_CANDIDATE = 10
#: inclusion fraction rho of the uniform design; the paper leaves it unstated, 1/2 is Ilyas et al.'s usual choice
UNIFORM_RHO = 0.5
#: l1 strength as a fraction of alpha_max, the smallest alpha at which the LASSO's answer is zero (unstated there)
ALPHA_RATIO = 1e-2

Subset = tuple[int, ...]


@dataclass(frozen=True)
class Design:
    """A DataModel design: the m x N matrix A, the subsets to fine-tune, and which subsets make each row's y_r.

    Row r's response is c * (u(subsets[plus[r]]) - u(subsets[minus[r]])) for the compressed-sensing design
    (eq. cs_response) and u(subsets[plus[r]]) for the uniform one (eq. uniform_response, minus[r] = -1, c = 1).
    `subsets` holds each distinct subset once (sorted candidate indices), in order of first use.
    """

    kind: Literal["uniform", "cs"]
    A: np.ndarray
    subsets: tuple[Subset, ...]
    plus: np.ndarray
    minus: np.ndarray
    c: float

    @property
    def rows(self) -> int:
        """m: the rows of A (measurements)."""
        return int(self.A.shape[0])

    def responses(self, utilities: np.ndarray) -> np.ndarray:
        """y (length m) from the utilities of `subsets` (one per subset, in their order)."""
        u = np.asarray(utilities, dtype=np.float64)
        if u.shape != (len(self.subsets),):
            raise ValueError(f"need one utility per design subset ({len(self.subsets)}), got shape {u.shape}")
        if not np.all(np.isfinite(u)):
            raise ValueError("utilities must be finite")
        if self.kind == "uniform":
            return u[self.plus]
        return self.c * (u[self.plus] - u[self.minus])


def _register(subsets: dict[Subset, int], members: np.ndarray) -> int:
    """The index of a subset in `subsets` (insertion-ordered), adding it if new."""
    key = tuple(int(i) for i in np.flatnonzero(members))
    return subsets.setdefault(key, len(subsets))


def uniform_design(n: int, *, rows: int | None = None, rho: float = UNIFORM_RHO, seed: int = 0) -> Design:
    """Eq. uniform_design: m subsets of fixed size round(rho N) drawn uniformly, A_ri = 1{i in S_r}; m defaults
    to the paper's 10 N fine-tunes."""
    if n < 2:
        raise ValueError(f"a design needs at least 2 candidates, got {n}")
    if not 0.0 < rho < 1.0:
        raise ValueError(f"rho must be in (0, 1), got {rho}")
    m = RUNS_PER_CANDIDATE * n if rows is None else rows
    if m < 1:
        raise ValueError(f"rows must be >= 1, got {m}")
    size = min(max(round(rho * n), 1), n - 1)
    rng = np.random.default_rng([seed, 0xD1])
    A = np.zeros((m, n))
    for r in range(m):
        A[r, rng.choice(n, size=size, replace=False)] = 1.0
    index: dict[Subset, int] = {}
    plus = np.array([_register(index, A[r]) for r in range(m)], dtype=np.int64)
    return Design("uniform", A, tuple(index), plus, np.full(m, -1, dtype=np.int64), 1.0)


def cs_design(n: int, *, rows: int | None = None, seed: int = 0) -> Design:
    """Eqs. cs_design and cs_two_subsets: A_ri = c xi_ri with c = sqrt(3/N), xi = +1, 0, -1 with probability
    1/6, 2/3, 1/6; row r is trained as S_r1 = {xi in {0, +1}} and S_r2 = {xi in {0, -1}}. m defaults to 5 N
    rows: the paper's 10 N fine-tunes, two per row."""
    if n < 2:
        raise ValueError(f"a design needs at least 2 candidates, got {n}")
    m = RUNS_PER_CANDIDATE * n // 2 if rows is None else rows
    if m < 1:
        raise ValueError(f"rows must be >= 1, got {m}")
    rng = np.random.default_rng([seed, 0xC5])
    xi = rng.choice(np.array([1.0, 0.0, -1.0]), size=(m, n), p=[1 / 6, 2 / 3, 1 / 6])
    c = math.sqrt(3.0 / n)
    index: dict[Subset, int] = {}
    plus = np.array([_register(index, xi[r] >= 0) for r in range(m)], dtype=np.int64)
    minus = np.array([_register(index, xi[r] <= 0) for r in range(m)], dtype=np.int64)
    return Design("cs", c * xi, tuple(index), plus, minus, c)


def alpha_max(A: np.ndarray, y: np.ndarray) -> float:
    """The smallest alpha of eq. datamodel_lasso (||Aw - y||^2 + alpha ||w||_1, no intercept) whose answer is
    w = 0: 2 ||A^T y||_inf."""
    return 2.0 * float(np.max(np.abs(np.asarray(A).T @ np.asarray(y))))


def lasso(A: np.ndarray, y: np.ndarray, alpha: float, *, max_iter: int = 100_000, tol: float = 1e-10) -> np.ndarray:
    """Eq. datamodel_lasso: argmin_w ||Aw - y||_2^2 + alpha ||w||_1 (no intercept), by scikit-learn's Lasso, whose
    objective is this one divided by 2m."""
    # scikit-learn (seconds to import): only when a datamodel is fitted
    from sklearn.linear_model import Lasso

    A = np.asarray(A, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if alpha < 0 or not math.isfinite(alpha):
        raise ValueError(f"alpha must be a finite number >= 0, got {alpha}")
    if alpha == 0.0:  # least squares (the minimum-norm answer where A is rank-deficient)
        return np.linalg.lstsq(A, y, rcond=None)[0]
    model = Lasso(alpha=alpha / (2 * A.shape[0]), fit_intercept=False, max_iter=max_iter, tol=tol)
    model.fit(A, y)
    return np.asarray(model.coef_, dtype=np.float64)


def fit_datamodel(design: Design, utilities: np.ndarray, *, alpha: float | None = None,
                  alpha_ratio: float = ALPHA_RATIO) -> np.ndarray:
    """Per-candidate scores w_hat (eq. datamodel_lasso) from the utilities of design.subsets (higher is better);
    alpha in the paper's units, else alpha_ratio * alpha_max (scale-free: the same for losses or accuracies).

    The uniform design has no intercept: give utilities relative to the target-only fine-tune (u(empty) = 0), as
    u(S) = L_val(target only) - L_val(S) is; the compressed-sensing differences cancel any offset themselves.
    """
    y = design.responses(utilities)
    if alpha is None:
        alpha = alpha_ratio * alpha_max(design.A, y)
    return lasso(design.A, y, alpha)


def utilities_from_losses(losses: np.ndarray, target_only_loss: float) -> np.ndarray:
    """u(S) = L_val(target only) - L_val(target + S) per fine-tune: the improvement over target only."""
    return float(target_only_loss) - np.asarray(losses, dtype=np.float64)
