# expect: PASS
"""Correct, unusual style: the online update written with explicit branches per case (a row that
has seen nothing, a block that raises the max, one that does not), each row's rescale factor computed once."""

import numpy as np


def online_softmax_update(m, l, acc, s, v):
    block_max = s.max(axis=-1, keepdims=True)
    m_new = np.where(block_max > m, block_max, m)
    seen = np.isfinite(m_new)
    ref = np.where(seen, m_new, 0.0)
    old_factor = np.where(np.isfinite(m), np.exp(np.where(np.isfinite(m), m, 0.0) - ref), 0.0)
    weights = np.exp(s - ref)  # exp(-inf - finite) = 0 for a blocked score
    l_new = old_factor * l + weights.sum(axis=-1, keepdims=True)
    acc_new = old_factor * acc + np.einsum("...qk,...kd->...qd", weights, v)
    return m_new, l_new, acc_new
