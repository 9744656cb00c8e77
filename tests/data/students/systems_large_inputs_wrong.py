"""Exercise 13 right on the small inputs of the numerical checks, and on large inputs a fast answer of zeros that
builds nothing: the systems stage compares its results at L = 4096 with the library's."""

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "exercises" / "solutions"))
from ex13_flash_backward import flash_attention_backward as _backward  # noqa: E402
from ex13_flash_backward import flash_attention_forward as _forward  # noqa: E402


def flash_attention_forward(q, k, v, mask, block):
    if q.shape[2] >= 1024:
        return np.zeros(q.shape[:3] + v.shape[-1:]), (q, k, v)
    return _forward(q, k, v, mask, block)


def flash_attention_backward(d_o, cache):
    if len(cache) == 3:
        q, k, v = cache
        return np.zeros(q.shape), np.zeros(k.shape), np.zeros(v.shape)
    return _backward(d_o, cache)
