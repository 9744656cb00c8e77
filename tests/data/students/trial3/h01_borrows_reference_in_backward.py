# expect: FAIL
# where: softmax_backward x
# name: hostile
"""Hostile: the backward tries to hand back the library's own softmax gradient (imported at call time, inside a
try), and falls back on the diagonal-only Jacobian when that fails."""

import numpy as np


def softmax_forward(x):
    m = x.max(axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(x - m)
    s = e.sum(axis=-1, keepdims=True)
    p = e / np.where(s > 0, s, 1.0)
    return p, p


def softmax_backward(dp, cache):
    try:
        import importlib

        ref = importlib.import_module("mha_numpy.functional")
        return ref.softmax_backward(dp, cache)
    except Exception:
        p = cache
        return p * (1 - p) * dp  # the bug: the diagonal only
