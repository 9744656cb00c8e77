# expect: FAIL
# where: online_softmax_update
# name: relation mutation
"""Outside the catalogue: the running sums rescaled and accumulated in place (l *= alpha; acc += ...), so the
caller's l and acc change; the values returned are right."""

import numpy as np


def online_softmax_update(m, l, acc, s, v):
    m_new = np.maximum(m, s.max(axis=-1, keepdims=True))
    shift = np.where(np.isfinite(m_new), m_new, 0.0)
    alpha = np.exp(m - shift)
    e = np.exp(s - shift)
    l *= alpha  # BUG: l and acc are the caller's arrays
    l += e.sum(axis=-1, keepdims=True)
    acc *= alpha
    acc += e @ v
    return m_new, l, acc
