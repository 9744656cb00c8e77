# expect: FAIL
# where: softmax_backward
# name: hostile | relation cache
"""Hostile (or a premature optimisation): the forward keeps its weights in one module-level buffer and returns that
buffer as its cache, so the next forward call overwrites the cache of the previous one (two softmax layers, or a
forward for the next batch before this one's backward, get wrong gradients)."""

import numpy as np

_BUFFER = {}


def softmax_forward(x):
    m = np.max(x, axis=-1, keepdims=True)
    e = np.exp(x - np.where(np.isfinite(m), m, 0.0))
    total = e.sum(axis=-1, keepdims=True)
    p = e / np.where(total > 0, total, 1.0)
    buffer = _BUFFER.setdefault(p.shape, np.empty(p.shape))
    buffer[...] = p  # BUG: one buffer per shape, shared by every call
    return p, buffer


def softmax_backward(dp, cache):
    p = cache
    return p * (dp - (p * dp).sum(axis=-1, keepdims=True))
