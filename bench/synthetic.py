"""Clustered, redundant, unit-norm synthetic gradients (the regime of clustered candidate pools)."""

from __future__ import annotations

import argparse

import numpy as np


def case(text: str) -> tuple[int, int]:
    """'NxP' -> (N, p), both positive: a bench's command-line problem size."""
    n, p = (int(v) for v in text.lower().split("x"))
    if n <= 0 or p <= 0:
        raise argparse.ArgumentTypeError(f"a case is NxP with N, P > 0, got {text!r}")
    return n, p


def clustered_gradients(n: int, p: int = 4096, *, cluster_size: int = 20, spread: float = 0.35,
                        seed: int = 0, chunk: int = 4096) -> tuple[np.ndarray, np.ndarray]:
    """(G [n, p] float64 unit rows, g_tar [p] float32): n // cluster_size clusters of near-duplicate gradients.

    The draws are float32; the casts to float64 are explicit so that numpy 1.26 (value-based casting) and
    numpy 2 (NEP 50, where a float32 array divided by np.sqrt(p) becomes float64) give the same bits, the
    ones every figure in bench/RESULTS.md was measured on. The noise is drawn `chunk` rows at a time (the generator
    fills row after row, so the bits are those of one draw): the peak is G itself plus a chunk, where one draw held
    about 2.5 G (16 GB at N = 100,000, p = 8192).
    """
    rng = np.random.default_rng(seed)
    n_clusters = max(2, n // cluster_size)
    centers = rng.standard_normal((n_clusters, p)).astype(np.float32)
    centers /= np.linalg.norm(centers, axis=1, keepdims=True)
    labels = rng.integers(0, n_clusters, size=n)
    G = np.empty((n, p))
    for lo in range(0, n, chunk):
        hi = min(n, lo + chunk)
        noise = (spread * rng.standard_normal((hi - lo, p)).astype(np.float32)).astype(np.float64) / np.sqrt(p)
        np.add(centers[labels[lo:hi]], noise, out=G[lo:hi])
        G[lo:hi] /= np.linalg.norm(G[lo:hi], axis=1, keepdims=True)
    mix = rng.standard_normal(min(8, n_clusters)).astype(np.float32)
    g_noise = (0.5 * rng.standard_normal(p).astype(np.float32)).astype(np.float64) / np.sqrt(p)
    g_tar = mix @ centers[: len(mix)] + g_noise
    return G, (g_tar / np.linalg.norm(g_tar)).astype(np.float32)


def clustered_gram(n: int, p: int = 4096, *, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(K = G G^T symmetrised, beta = G g_tar, G, g_tar), all float64, of clustered_gradients(n, p, seed=seed)."""
    G, g32 = clustered_gradients(n, p, seed=seed)
    g = g32.astype(np.float64)
    K = G @ G.T
    return 0.5 * (K + K.T), G @ g, G, g
