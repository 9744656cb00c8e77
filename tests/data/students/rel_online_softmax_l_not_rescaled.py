"""A student's online-softmax update that rescales the accumulator but not the running sum ℓ."""

# relation: online_softmax_update the context acc / l (from online_softmax_update's running m, l and acc) is, row by row
import numpy as np


def online_softmax_update(m, l, acc, s, v):
    m_new = np.maximum(m, s.max(axis=-1, keepdims=True))  # (..., Lq, 1)
    shift = np.where(np.isfinite(m_new), m_new, 0.0)
    alpha = np.exp(m - shift)
    e = np.exp(s - shift)  # (..., Lq, block)
    return m_new, l + e.sum(axis=-1, keepdims=True), alpha * acc + e @ v  # ℓ kept in the old max's units
