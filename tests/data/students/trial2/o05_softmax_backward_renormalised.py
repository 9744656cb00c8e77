# expect: FAIL
# where: softmax_backward x
# name: relation masked-rows
"""Outside the catalogue: the backward divides the row term by sum(p) "to be safe"; sum(p) = 1 on every row but a
fully masked one, where it is 0 and the gradient becomes NaN."""

import numpy as np


def softmax_forward(x):
    finite_max = np.where(np.isfinite(x), x, -1e300).max(axis=-1, keepdims=True)
    e = np.where(np.isfinite(x), np.exp(x - finite_max), 0.0)
    total = e.sum(axis=-1, keepdims=True)
    p = np.divide(e, total, out=np.zeros_like(e), where=total > 0)
    return p, p


def softmax_backward(dp, cache):
    p = cache
    row = (p * dp).sum(axis=-1, keepdims=True) / p.sum(axis=-1, keepdims=True)  # BUG: 0/0 on a masked row
    return p * (dp - row)
