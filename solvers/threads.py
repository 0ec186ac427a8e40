"""The BLAS thread limit around one solve (process-wide while it holds): one thread for small problems."""

from __future__ import annotations

import functools

SINGLE_THREAD_MAX_N = 2000


@functools.lru_cache(maxsize=1)
def threadpools():
    """The process's threadpoolctl controller, made once (scanning the loaded BLAS libraries: 0.33 -> 0.01 ms per
    limit)."""
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()


def blas_threads(n: int):
    """A context manager: one BLAS thread up to N = SINGLE_THREAD_MAX_N, the default above.

    Measured at N = 1000 on 2 cores (bench/blas_threads.py): one thread solves in a steady 15 ms where two take
    14-144 ms (thread hand-offs dominate factorisations of this size).
    """
    return threadpools().limit(limits=1 if n <= SINGLE_THREAD_MAX_N else None, user_api="blas")
