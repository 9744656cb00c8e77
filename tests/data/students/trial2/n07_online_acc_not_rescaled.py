# expect: FAIL
# where: online_softmax_update
# name: catalogue online_no_rescale
"""Near online_no_rescale: l is rescaled when the max grows, acc is not."""

import numpy as np


def online_softmax_update(m, l, acc, s, v):
    m_new = np.maximum(m, s.max(axis=-1, keepdims=True))
    shift = np.where(np.isfinite(m_new), m_new, 0.0)
    alpha = np.exp(m - shift)
    e = np.exp(s - shift)
    return m_new, alpha * l + e.sum(axis=-1, keepdims=True), acc + e @ v  # BUG: acc not multiplied by alpha
