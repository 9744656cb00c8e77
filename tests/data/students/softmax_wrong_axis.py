"""A student's softmax backward that sums over the queries."""

# expect: softmax_backward softmax_wrong_axis
import numpy as np


def softmax_forward(x):
    m = x.max(axis=-1, keepdims=True)
    e = np.exp(x - np.where(np.isfinite(m), m, 0.0))
    s = e.sum(axis=-1, keepdims=True)
    p = e / np.where(s == 0, 1.0, s)
    return p, p


def softmax_backward(dp, cache):
    p = cache
    return p * (dp - np.sum(p * dp, axis=-2, keepdims=True))
