"""``mha_numpy.allocator.keep_freed_memory()``: let glibc keep the memory of freed arrays for the next ones.

NumPy code makes a fresh array for most steps, and a big one (BERT's scores, its FFN activations: megabytes) is
freed a step later. glibc's malloc hands a block that large to the kernel when it is freed (``mmap``/``munmap``
above its mmap threshold, or by trimming the heap's top above its trim threshold), so the next array of that
size starts as untouched pages: one page fault per 4 KiB on its first write. A fault costs ~1 µs on bare metal
and ~4-6 µs in the virtual machine this project is measured on, which made ~19% of a float32 BERT band's time
(``benchmarks/profile_bert.py``: 9 000 faults per 2 × 255 band, 299 ms of CPU; none, 243 ms, with this call).

``keep_freed_memory()`` raises both thresholds (``mallopt(M_MMAP_THRESHOLD)`` and ``mallopt(M_TRIM_THRESHOLD)``)
so that freed blocks stay in the process and are reused. It changes the whole process (every library in it,
torch's tensors included) for the rest of its life, and the process keeps up to its peak of freed memory
instead of returning it, so the library never calls it on its own: the command line (``python -m mha_numpy``)
and the benchmark scripts do, and say so. Setting ``MALLOC_MMAP_THRESHOLD_`` and ``MALLOC_TRIM_THRESHOLD_`` in
the environment before Python starts does the same. Elsewhere than glibc (macOS, musl) it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util

from ._checks import as_int

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's <malloc.h>
DEFAULT_BYTES = 256 * 2**20  # blocks up to this size come from (and go back to) the heap, never to the kernel


def keep_freed_memory(nbytes: int = DEFAULT_BYTES) -> bool:
    """Raise glibc's mmap and trim thresholds to ``nbytes`` (a positive int, NumPy's integers too; not a bool):
    -> True if set, False if this C library has no mallopt."""
    nbytes = as_int(nbytes, "nbytes", minimum=1)  # np.int64(2**20) is an int; True, 1.5 and "1" are not
    name = ctypes.util.find_library("c")
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError, TypeError):  # no C library found by name, or one without mallopt
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    value = min(nbytes, 2**31 - 1)  # mallopt takes an int
    return bool(mallopt(M_MMAP_THRESHOLD, value)) and bool(mallopt(M_TRIM_THRESHOLD, value))
