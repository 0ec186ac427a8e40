"""An independent KMM formulation for tests: split w = u - v (u, v >= 0), solved with SciPy, not CVXPY."""

from __future__ import annotations

import numpy as np
from scipy.optimize import minimize


def _split_objective(K, beta, gamma):
    def f(z):
        n = len(beta)
        w = z[:n] - z[n:]
        Kw = K @ w
        val = 0.5 * w @ Kw - beta @ w + gamma * z.sum()
        g = Kw - beta
        return val, np.concatenate([g + gamma, -g + gamma])

    return f


def scipy_penalised(K: np.ndarray, beta: np.ndarray, gamma: float) -> np.ndarray:
    """argmin 0.5 w'Kw - beta'w + gamma ||w||_1 via L-BFGS-B on the split (smooth, bound-constrained) form."""
    n = len(beta)
    res = minimize(_split_objective(K, beta, gamma), np.zeros(2 * n), jac=True, method="L-BFGS-B",
                   bounds=[(0, None)] * (2 * n), options={"ftol": 1e-15, "gtol": 1e-12, "maxiter": 20000})
    return res.x[:n] - res.x[n:]


def sklearn_penalised(G: np.ndarray, g_tar: np.ndarray, gamma: float) -> np.ndarray:
    """The penalised form as a Lasso in gradient space: X = G^T, y = g_tar, alpha = gamma / p (coordinate descent)."""
    from sklearn.linear_model import Lasso

    p = G.shape[1]
    model = Lasso(alpha=gamma / p, fit_intercept=False, tol=1e-14, max_iter=1_000_000)
    model.fit(G.T, g_tar)
    return model.coef_


def scipy_budget(K: np.ndarray, beta: np.ndarray, budget: float) -> np.ndarray:
    """argmin 0.5 w'Kw - beta'w s.t. ||w||_1 <= budget via SLSQP on the split form."""
    n = len(beta)
    f = _split_objective(K, beta, 0.0)
    res = minimize(f, np.zeros(2 * n), jac=True, method="SLSQP", bounds=[(0, None)] * (2 * n),
                   constraints=[{"type": "ineq", "fun": lambda z: budget - z.sum(), "jac": lambda z: -np.ones_like(z)}],
                   options={"ftol": 1e-14, "maxiter": 2000})
    return res.x[:n] - res.x[n:]
