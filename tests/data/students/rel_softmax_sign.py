"""A student's softmax backward with the two terms the wrong way round."""

# relation: softmax_backward dx (in softmax_backward) has the wrong sign
import numpy as np


def softmax_forward(x):
    m = x.max(axis=-1, keepdims=True)
    e = np.exp(x - np.where(np.isfinite(m), m, 0.0))
    total = e.sum(axis=-1, keepdims=True)
    p = e / np.where(total > 0, total, 1.0)
    return p, p


def softmax_backward(dp, cache):
    p = cache
    return p * ((p * dp).sum(axis=-1, keepdims=True) - dp)
