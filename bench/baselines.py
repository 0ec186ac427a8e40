"""The library baseline the solver benches time convalue against: scikit-learn's coordinate descent."""

from __future__ import annotations

import warnings

import numpy as np


def sklearn_lasso(G: np.ndarray, g: np.ndarray, K: np.ndarray, beta: np.ndarray, gamma: float,
                  max_iter: int, tol: float = 1e-4) -> tuple[np.ndarray, bool]:
    """(w, converged): coordinate descent on the precomputed Gram, the Lasso with X = G^T, y = g_tar, alpha = gamma / p.

    tol is scikit-learn's duality-gap tolerance (its default 1e-4 stops at KKT violations of about 1e-5 to 1e-4 here).
    """
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import enet_path

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        _, coefs, _ = enet_path(np.asfortranarray(G.T), g, l1_ratio=1.0, alphas=[gamma / G.shape[1]],
                                precompute=K, Xy=beta, max_iter=max_iter, tol=tol, check_input=False)
    return coefs[:, 0], not any(issubclass(c.category, ConvergenceWarning) for c in caught)
