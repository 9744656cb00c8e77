# expect: FAIL
# where: softmax_backward x
# name: catalogue softmax_wrong_axis | relation wrong-axis
"""Near softmax_wrong_axis: the row sum taken over axis 1 (the heads) instead of the keys."""

import numpy as np


def softmax_forward(x):
    m = np.max(x, axis=-1, keepdims=True)
    m[~np.isfinite(m)] = 0.0
    e = np.exp(x - m)
    s = e.sum(axis=-1, keepdims=True)
    s[s == 0] = 1.0
    return e / s, e / s


def softmax_backward(dp, cache):
    p = cache
    return p * (dp - np.sum(p * dp, axis=1, keepdims=True))  # BUG: axis 1 is the heads, not the keys
