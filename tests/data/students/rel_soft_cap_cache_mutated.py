"""A student's soft-cap forward that scales tanh in place after caching it: the cache holds cap · tanh, not tanh (the
output and the backward's formula are right)."""

# relation: soft_cap_backward dscores (in soft_cap_backward) is right when it reads the reference forward's cache
import numpy as np


def soft_cap_forward(scores, cap):
    t = np.tanh(scores / cap)  # (...)
    out = t  # the same array, not a copy
    out *= cap  # in place: t, the cache below, is now cap · tanh
    return out, t


def soft_cap_backward(d_out, cache):
    t = cache
    return d_out * (1.0 - t * t)
