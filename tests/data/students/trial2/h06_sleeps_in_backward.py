# expect: FAIL
# where: softmax_backward
# name: hostile
"""Hostile: the backward sleeps for an hour (a time limit must stop it; the forward is right)."""

import time

import numpy as np


def softmax_forward(x):
    m = np.max(x, axis=-1, keepdims=True)
    e = np.exp(x - np.where(np.isfinite(m), m, 0.0))
    s = e.sum(axis=-1, keepdims=True)
    return e / np.where(s > 0, s, 1.0), e / np.where(s > 0, s, 1.0)


def softmax_backward(dp, cache):
    time.sleep(3600)
    p = cache
    return p * (dp - (p * dp).sum(axis=-1, keepdims=True))
