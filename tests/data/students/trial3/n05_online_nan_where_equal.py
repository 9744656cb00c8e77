# expect: FAIL
# where: online_softmax_update
# name: catalogue online_nan | relation masked-rows
"""Near online_nan: the student guards alpha (1 where the max did not move, so -inf = -inf gives 1, not NaN) but
not the block's exponentials, exp(s - m_new) with s = m_new = -inf: NaN on a row that has seen only -inf."""

import numpy as np


def online_softmax_update(m, l, acc, s, v):
    m_new = np.maximum(m, np.max(s, axis=-1, keepdims=True))
    alpha = np.where(m == m_new, 1.0, np.exp(m - m_new))
    p = np.exp(s - m_new)  # BUG: NaN where m_new is -inf
    return m_new, alpha * l + p.sum(axis=-1, keepdims=True), alpha * acc + p @ v
