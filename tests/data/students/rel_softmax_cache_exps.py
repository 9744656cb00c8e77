"""A student's softmax forward that caches the exponentials before the division: the backward, right, reads them
as p."""

# relation: softmax_backward dx (in softmax_backward) is right when it reads the reference forward's cache
import numpy as np


def softmax_forward(x):
    m = x.max(axis=-1, keepdims=True)
    e = np.exp(x - np.where(np.isfinite(m), m, 0.0))
    cache = e  # "p is e once divided": the division below makes a new array, the cache keeps e
    total = e.sum(axis=-1, keepdims=True)
    return e / np.where(total > 0, total, 1.0), cache


def softmax_backward(dp, cache):
    p = cache
    return p * (dp - (p * dp).sum(axis=-1, keepdims=True))
