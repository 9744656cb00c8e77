"""A student's soft-cap backward that forgot tanh'."""

# expect: soft_cap_backward soft_cap_identity
import numpy as np


def soft_cap_forward(scores, cap):
    t = np.tanh(scores / cap)
    return cap * t, t


def soft_cap_backward(d_out, cache):
    return d_out  # cap · tanh'(s / cap) · (1 / cap)
