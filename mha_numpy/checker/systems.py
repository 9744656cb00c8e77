"""Exercise 13's systems stage: the student's flash forward + backward graded on memory and time, not only numbers.

The student's child process runs ``flash_attention_forward`` then ``flash_attention_backward`` at L = 4096
(d = 64, one head, float64, no mask, key blocks of 128) under tracemalloc, which NumPy reports its arrays to: the
peak is measured, not read from the code; ``child.MEASURE_REPEATS`` runs, the largest peak and the fastest time
kept. This process runs the library's ``kernels.ChunkedKernel`` (one thread)
on the same inputs the same way. Targets (stated in exercises/ex13_flash_backward.ipynb):

- memory: peak < ``MEMORY_FRACTION`` of one (L, L) array of the inputs' dtype (a kernel that builds the scores,
  the weights or dS whole needs at least one);
- time: at most ``TIME_RATIO`` × the library's time on the same machine, measured just before.
"""

from __future__ import annotations

import time
import tracemalloc

import numpy as np

from ..kernels import ChunkedKernel
from .child import MEASURE_REPEATS
from .runner import Row

SIZE, HEAD_DIM, BLOCK = 4096, 64, 128
MEMORY_FRACTION, TIME_RATIO = 0.5, 3.0
FUNCTION = "flash_attention (memory, time)"


def inputs(size: int, head_dim: int = HEAD_DIM, seed: int = 0):
    """q, k, v (1, 1, size, head_dim) and d_o (1, 1, size, head_dim), float64."""
    rng = np.random.default_rng(seed)
    q, k, v, d_o = (rng.standard_normal((1, 1, size, head_dim)) for _ in range(4))
    return q, k, v, d_o


def library_cost(q, k, v, d_o) -> tuple[int, float]:
    """The chunked kernel's forward + backward on the same inputs: (peak bytes under tracemalloc, seconds)."""
    kernel, peak, seconds = ChunkedKernel(num_threads=1), 0, float("inf")
    for _ in range(MEASURE_REPEATS):  # as the student's side: the largest peak, the fastest time
        tracemalloc.start()
        try:
            began = time.perf_counter()
            _, cache = kernel.forward(q, k, v)
            kernel.backward(d_o, cache)
            seconds = min(seconds, time.perf_counter() - began)
            peak = max(peak, tracemalloc.get_traced_memory()[1])
        finally:
            tracemalloc.stop()
    return peak, seconds


def verdict(peak: int, seconds: float, full: int, library: float, memory_fraction: float, time_ratio: float) -> Row:
    """PASS when both targets hold; FAIL naming each target missed. The detail always gives both measurements."""
    ratio = seconds / max(library, 1e-9)
    memory = f"peak {peak / 2**20:.1f} MiB = {peak / full:.3f} of one (L, L) array (target < {memory_fraction:g})"
    speed = (
        f"time {seconds:.2f} s = {ratio:.2f}× the library's chunked kernel ({library:.2f} s; target ≤ {time_ratio:g}×)"
    )
    missed = [name for name, ok in (("memory", peak < memory_fraction * full), ("time", ratio <= time_ratio)) if not ok]
    detail = f"{memory}; {speed}"
    if missed:
        detail = f"{' and '.join(missed)} target missed: {detail}"
    return Row(FUNCTION, "FAIL" if missed else "PASS", detail)


def check_systems(
    student, size: int = SIZE, memory_fraction: float = MEMORY_FRACTION, time_ratio: float = TIME_RATIO
) -> Row:
    """The systems row for a student (a ``ChildProcess``: it has ``measure``) whose flash pair passed."""
    q, k, v, d_o = inputs(size)
    full = size * size * q.itemsize  # bytes of one (L, L) array
    _, library = library_cost(q, k, v, d_o)
    block = max(1, size * BLOCK // SIZE)  # 128 at L = 4096: a tile (L, block) is 1/32 of the (L, L) array
    args = [("q", q), ("k", k), ("v", v), ("mask", None), ("block", block)]
    student.start("flash_attention_backward")
    try:
        peak, seconds = student.measure("flash_attention_forward", "flash_attention_backward", args, d_o)
    except Exception as e:  # noqa: BLE001 - the student's error, a time-out: the row says it
        return Row(FUNCTION, "FAIL", f"at L = {size}: {e}")
    return verdict(int(peak), float(seconds), full, library, memory_fraction, time_ratio)
