"""Solutions to exercises/ex07_online_softmax.ipynb."""

import numpy as np


def online_softmax_update(m, l, acc, s, v):
    m_new = np.maximum(m, s.max(axis=-1, keepdims=True))  # (..., Lq, 1)
    shift = np.where(np.isfinite(m_new), m_new, 0.0)  # a row that has seen only -inf: any finite shift
    alpha = np.exp(m - shift)  # rescales what was summed relative to the old max; exp(-inf) = 0 at the start
    e = np.exp(s - shift)  # (..., Lq, block)
    return m_new, alpha * l + e.sum(axis=-1, keepdims=True), alpha * acc + e @ v
