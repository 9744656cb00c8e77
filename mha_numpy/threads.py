"""``mha_numpy.threads``: one thread pool per size, BLAS held to one thread while our own pool runs, and products
on that pool. A leaf of the package (it imports nothing of mha_numpy): the kernels, the NumPy BERT's bands and
training all use it.

The limit is reference-counted under a lock: overlapping callers (several threads calling the chunked
kernel at once, or ``train`` around it) share one limit, and the last one out restores BLAS's original
thread count. Without the count, each caller saves and restores the other's limit, and BLAS can stay
at one thread for the rest of the process. The first one in and the last one out are often different threads,
so the limit is set and restored from any thread: OpenBLAS's own thread count (NumPy's wheels: OpenBLAS on
pthreads) is one process-wide number that any thread may set, but threadpoolctl >= 3.8 passes a set on only
from the first thread that set one (its "controlling thread", for as long as that thread lives) and silently
drops the others, so a restore from another thread left BLAS on one thread, for good (``_set`` takes the control
for each call). A BLAS whose limit is per thread (OpenBLAS built on OpenMP) is limited in each thread that enters
and restored by that same thread, pool threads included.

Why a module's projections run on the pool too (``pooled_matmul``): after a product on its own threads,
OpenBLAS keeps its worker threads spinning for a while (about 0.1 s: ``OPENBLAS_THREAD_TIMEOUT``, read once
at load) in case another product follows. A pool started in that window shares the two cores with a
spinning thread: measured at (1, 2048, 768, 12) in float32, the chunked forward right after the (threaded)
QKV product took 136 ms instead of 110 ms. So while a module call runs on our pool, every product of the
call runs on it, and BLAS never starts its own threads in between.
"""

from __future__ import annotations

import contextlib
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

AVAILABLE_CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)

_POOLS: dict[int, ThreadPoolExecutor] = {}
_LOCK = threading.Lock()
_STATE = {"users": 0, "original": [], "libraries": None}  # the process-wide limit: its users, the counts it replaced
_THREAD = threading.local()  # .depth, .original: the limit of BLAS libraries whose limit is per thread
_WORKER = threading.local()  # .busy is True in a pool thread while it runs items


def _libraries() -> tuple[list, list]:
    """The BLAS libraries threadpoolctl finds, found once (~0.5 ms): (process-wide limit, per-thread limit)."""
    with _LOCK:
        if _STATE["libraries"] is None:
            try:
                from threadpoolctl import ThreadpoolController
            except ImportError:  # pragma: no cover - threadpoolctl is in requirements.txt
                libs = []
            else:
                libs = ThreadpoolController().select(user_api="blas").lib_controllers
            per_thread = [lib for lib in libs if getattr(lib, "threading_layer", None) == "openmp"]
            _STATE["libraries"] = ([lib for lib in libs if lib not in per_thread], per_thread)
        return _STATE["libraries"]


def _set(lib, num_threads: int | None) -> None:
    """Set a process-wide BLAS thread count from whichever thread calls (under ``_LOCK``).

    threadpoolctl >= 3.8 obeys only its "controlling thread" for OpenBLAS on pthreads: take the control for this
    call and give it up after, so that no thread keeps it (older versions have no such control and set directly).
    """
    if num_threads is None:  # a library that could not report its count: leave it as it is
        return
    release = getattr(type(lib), "clear_controlling_thread", None)
    if release is not None:
        release(force=True)
    lib.set_num_threads(num_threads)
    if release is not None:
        release(force=True)


@contextlib.contextmanager
def blas_single_threaded():
    """Run the block with NumPy's BLAS on one thread; nested and concurrent uses share one limit, and it is
    restored when the last of them ends, whichever thread that is."""
    shared, per_thread = _libraries()
    with _LOCK:
        if _STATE["users"] == 0:
            _STATE["original"] = [lib.get_num_threads() for lib in shared]
            for lib in shared:
                _set(lib, 1)
        _STATE["users"] += 1
    depth = getattr(_THREAD, "depth", 0)
    if depth == 0 and per_thread:
        _THREAD.original = [lib.get_num_threads() for lib in per_thread]
        for lib in per_thread:
            lib.set_num_threads(1)  # this thread's own limit: no control to take
    _THREAD.depth = depth + 1
    try:
        yield
    finally:
        _THREAD.depth -= 1
        if _THREAD.depth == 0 and per_thread:
            for lib, n in zip(per_thread, _THREAD.original):
                if n is not None:
                    lib.set_num_threads(n)
        with _LOCK:
            _STATE["users"] -= 1
            if _STATE["users"] == 0:
                for lib, n in zip(shared, _STATE["original"]):
                    _set(lib, n)


def blas_threads() -> int:
    """How many threads NumPy's BLAS may use now: the largest count its libraries report (1 when none does).
    Inside ``blas_single_threaded`` (a pool item, say) it is 1."""
    shared, per_thread = _libraries()
    counts = [lib.get_num_threads() for lib in shared + per_thread]
    return max([n for n in counts if n] or [1])


def run_items(work, items, num_threads: int) -> None:
    """Call ``work(item)`` for every item: in this thread, or on a pool of ``num_threads``.

    Each pool thread takes the next item as soon as it is free (one shared iterator under a lock), so items
    of unequal cost (under a causal mask, a late query block has many more tiles than an early one) balance
    out: the threads finish at most one item apart. (Fixed groups of items did not: a group of late blocks
    could be left running alone at the end.) Called from an item that already runs on the pool (a kernel
    inside a BERT band), it runs the items in that thread: waiting for the pool from inside it would deadlock.
    The pool's threads handle floating-point errors as the caller does (``np.errstate`` is per thread: a caller's
    ``np.errstate(invalid="ignore")`` around a NaN input would not reach them otherwise).
    """
    if num_threads == 1 or len(items) <= 1 or getattr(_WORKER, "busy", False):
        for item in items:
            work(item)
        return
    with _LOCK:
        pool = _POOLS.get(num_threads)
        if pool is None:
            pool = _POOLS[num_threads] = ThreadPoolExecutor(num_threads, thread_name_prefix="mha_numpy")
    queue, queue_lock, done = iter(items), threading.Lock(), object()
    caller_errstate = np.geterr()  # the caller's floating-point error handling (np.errstate is per thread)

    def worker(_) -> None:
        _WORKER.busy = True
        try:  # a per-thread BLAS limit, and the caller's np.errstate, must be set in this thread too
            with blas_single_threaded(), np.errstate(**caller_errstate):
                while True:
                    with queue_lock:
                        item = next(queue, done)
                    if item is done:
                        return
                    work(item)
        finally:
            _WORKER.busy = False

    with blas_single_threaded():
        for _ in pool.map(worker, range(min(num_threads, len(items)))):  # re-raises the first exception of a worker
            pass


def pooled_matmul(a: np.ndarray, b: np.ndarray, num_threads: int) -> np.ndarray:
    """a @ b for a (N, K) and b (K, M), the rows of a cut into ``num_threads`` bands, one band per pool thread
    (BLAS on one thread each): the same products as BLAS's own threads make, on our threads.

    With ``num_threads`` = 1 it is ``a @ b`` with BLAS's threads (the chunked kernel's tiles use them then too).
    """
    if num_threads == 1 or a.shape[0] < 2:
        return a @ b  # (N, K) @ (K, M) -> (N, M)
    out = np.empty((a.shape[0], b.shape[1]), dtype=np.result_type(a, b))  # (N, M)
    N, t = a.shape[0], min(num_threads, a.shape[0])
    bands = row_bands(N, t)
    run_items(lambda rows: np.matmul(a[rows], b, out=out[rows]), bands, t)  # (n, K) @ (K, M) -> (n, M) each
    return out


def row_bands(n: int, num_bands: int) -> list[slice]:
    """``num_bands`` consecutive slices that cover range(n), their sizes differing by at most one (the rows of
    ``pooled_matmul``, the bands of sequences that BERT's inference and the fine-tuning's steps give each thread)."""
    return [slice(n * i // num_bands, n * (i + 1) // num_bands) for i in range(num_bands)]
