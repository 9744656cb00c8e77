"""Exercise 13 with the right numbers and the whole (Lq, Lk) matrices, and tracemalloc put out of action during each
call: stopped by the real function (kept before the names are replaced), and its names replaced to report nothing
traced. A checker that asked the student's process (as the systems stage once did, under tracemalloc) reads a peak
of 0; the checker's own measurement, from outside the process, sees the (L, L) arrays."""

import tracemalloc

from flash_full_matrix import flash_attention_backward as _backward
from flash_full_matrix import flash_attention_forward as _forward

_stop = tracemalloc.stop
tracemalloc.start = lambda *args: None
tracemalloc.stop = lambda: None
tracemalloc.get_traced_memory = lambda: (0, 0)
tracemalloc.is_tracing = lambda: True


def flash_attention_forward(q, k, v, mask, block):
    _stop()
    return _forward(q, k, v, mask, block)


def flash_attention_backward(d_o, cache):
    _stop()
    return _backward(d_o, cache)
