"""A student's online-softmax update that rescales the wrong way round."""

# expect: online_softmax_update online_rescale_inverted
import numpy as np


def online_softmax_update(m, l, acc, s, v):
    m_new = np.maximum(m, s.max(axis=-1, keepdims=True))
    shift = np.where(np.isfinite(m_new), m_new, 0.0)
    alpha = np.exp(shift - m)
    e = np.exp(s - shift)
    return m_new, alpha * l + e.sum(axis=-1, keepdims=True), alpha * acc + e @ v
