"""One thread pool per size, and BLAS held to one thread while our own pool runs.

The limit is reference-counted under a lock: overlapping callers (several threads calling the chunked
kernel at once, or ``train`` around it) share one limit, and the last one out restores BLAS's original
thread count. Without the count, each caller saves and restores the other's limit, and BLAS can stay
at one thread for the rest of the process.
"""

from __future__ import annotations

import contextlib
import os
import threading
from concurrent.futures import ThreadPoolExecutor

AVAILABLE_CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)

_POOLS: dict[int, ThreadPoolExecutor] = {}
_LOCK = threading.Lock()
_STATE = {"users": 0, "limiter": None, "controller": None}


def _controller():
    """The threadpoolctl controller, made once (finding the BLAS libraries takes ~0.5 ms); None without it."""
    if _STATE["controller"] is None:
        try:
            from threadpoolctl import ThreadpoolController
        except ImportError:  # pragma: no cover - threadpoolctl is in requirements.txt
            _STATE["controller"] = False
        else:
            _STATE["controller"] = ThreadpoolController()
    return _STATE["controller"] or None


@contextlib.contextmanager
def blas_single_threaded():
    """Run the block with NumPy's BLAS on one thread; nested and concurrent uses share one limit."""
    controller = _controller()
    if controller is None:  # pragma: no cover
        yield
        return
    with _LOCK:
        if _STATE["users"] == 0:
            _STATE["limiter"] = controller.limit(limits=1, user_api="blas")
        _STATE["users"] += 1
    try:
        yield
    finally:
        with _LOCK:
            _STATE["users"] -= 1
            if _STATE["users"] == 0:
                _STATE["limiter"].restore_original_limits()
                _STATE["limiter"] = None


def run_items(work, items, num_threads: int) -> None:
    """Call ``work(item)`` for every item: in this thread, or on a pool of ``num_threads``."""
    if num_threads == 1 or len(items) <= 1:
        for item in items:
            work(item)
        return
    with _LOCK:
        pool = _POOLS.get(num_threads)
        if pool is None:
            pool = _POOLS[num_threads] = ThreadPoolExecutor(num_threads, thread_name_prefix="mha_numpy")
    n_groups = min(len(items), 4 * num_threads)  # a few groups per thread: balance, little hand-off cost

    def work_group(g: int) -> None:
        for item in items[g::n_groups]:  # interleaved, so a causal mask's light and heavy blocks mix
            work(item)

    with blas_single_threaded():
        for _ in pool.map(work_group, range(n_groups)):  # re-raises the first exception of a worker
            pass
