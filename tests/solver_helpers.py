"""Helpers shared by the KMM solver tests: the paper's example, random problems, a spy."""

from __future__ import annotations

import numpy as np

G_EX = np.array([[1.0, 0.1], [1.0, 0.1], [0.0, 1.0]])
G_TAR = np.array([1.0, 1.0])


def example():
    return G_EX @ G_EX.T, G_EX @ G_TAR


def random_gradients(draw_seed: int, n: int, p: int, dup: bool):
    rng = np.random.default_rng(draw_seed)
    G = rng.normal(size=(n, p))
    if dup and n >= 2:
        G[1] = G[0]  # an exactly duplicated candidate
    return G, rng.normal(size=p)


def random_problem(draw_seed: int, n: int, p: int, dup: bool):
    G, g = random_gradients(draw_seed, n, p, dup)
    return G @ G.T, G @ g


def _recorded(fn, log: list, entry):
    """fn, appending entry(*args, **kwargs) to log before each call: a spy that records what each call was given."""
    def recorded(*args, **kwargs):
        log.append(entry(*args, **kwargs))
        return fn(*args, **kwargs)
    return recorded


def _near_parallel(rng: np.random.Generator, n: int, p: int, mix: int = 5) -> tuple[np.ndarray, np.ndarray]:
    """Unit rows 1 + 0.02 noise (K has one eigenvalue near n) and a target the mean of the first `mix` of them."""
    G = 1.0 + 0.02 * rng.normal(size=(n, p))
    G /= np.linalg.norm(G, axis=1, keepdims=True)
    return G, G[:mix].mean(axis=0)


def _clustered(n: int, p: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Unit-norm gradients in n // 20 clusters of near-duplicates and a target mixing a few centres."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(n // 20, p))
    G = centers[rng.integers(0, n // 20, size=n)] + 0.35 * rng.normal(size=(n, p)) / np.sqrt(p) * np.linalg.norm(
        centers, axis=1).mean()
    G /= np.linalg.norm(G, axis=1, keepdims=True)
    g = centers[:5].sum(axis=0) + 0.5 * rng.normal(size=p)
    return G, g / np.linalg.norm(g)


def _assert_far_from_a_support_change(K: np.ndarray, beta: np.ndarray, gamma: float, w: np.ndarray,
                                      margin: float = 1e-6) -> None:
    """The optimum w is far from a change of support or signs: every inactive |r_i| (r = K w - beta) lies at least
    margin gamma below gamma and every active |w_i| is at least margin max|w|. Round-off (about 1e-13 here) then
    cannot move a candidate in or out, so exact methods (LARS, support solves) take the same steps on any BLAS and
    certify at 1e-10: a test may assert which of them answered."""
    r = K @ w - beta
    on = w != 0
    assert gamma - np.abs(r[~on]).max(initial=0.0) >= margin * gamma
    assert np.abs(w[on]).min(initial=np.inf) >= margin * np.abs(w).max()
