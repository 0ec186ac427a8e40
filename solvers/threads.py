"""The BLAS thread limit around one solve (process-wide while it holds): one thread for small problems."""

from __future__ import annotations

import functools
from contextlib import AbstractContextManager

from threadpoolctl import ThreadpoolController


@functools.lru_cache(maxsize=1)
def threadpools() -> ThreadpoolController:
    """The process's threadpoolctl controller, made once (scanning the loaded BLAS libraries costs more than a
    limit)."""
    return ThreadpoolController()


def blas_threads(n: int, single_thread_max_n: int) -> AbstractContextManager:
    """A context manager: one BLAS thread up to N = single_thread_max_n (the policy's linalg section), where thread
    hand-offs outweigh the work of each call; the default above."""
    return threadpools().limit(limits=1 if n <= single_thread_max_n else None, user_api="blas")
