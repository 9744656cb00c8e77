# expect: FAIL
# where: softmax_forward out
# name: relation masked-rows
"""Outside the catalogue: -inf replaced by -1e9 before the softmax "to avoid NaN", so a fully masked row becomes
uniform (1/Lk on every key) instead of zero weights; every other row is right to the last digit."""

import numpy as np


def softmax_forward(x):
    x = np.where(np.isneginf(x), -1e9, x)  # BUG: a fully masked row is then uniform
    z = x - x.max(axis=-1, keepdims=True)
    e = np.exp(z)
    p = e / e.sum(axis=-1, keepdims=True)
    return p, p


def softmax_backward(dp, cache):
    p = cache
    return p * dp - p * np.sum(p * dp, axis=-1, keepdims=True)
