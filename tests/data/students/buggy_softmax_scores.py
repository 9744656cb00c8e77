"""A student's file with two classic mistakes (used by tests/test_checker.py)."""

import numpy as np


def softmax_forward(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    p = e / e.sum(axis=-1, keepdims=True)
    return p, p


def softmax_backward(dp, cache):
    p = cache
    return p * (1 - p) * dp


def attention_scores_forward(q, k, scale):
    return q @ k.swapaxes(-1, -2) * scale, (q, k, scale)


def attention_scores_backward(d_scores, cache):
    q, k, scale = cache
    dS = d_scores * scale
    return dS.swapaxes(-1, -2) @ k, dS.swapaxes(-1, -2) @ q


def linear_backward(dy, cache):
    raise NotImplementedError
