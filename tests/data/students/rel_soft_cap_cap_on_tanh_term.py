"""A student's soft-cap backward that keeps the outer cap on the tanh² term only: d_out − cap · tanh² · d_out."""

# relation: soft_cap_backward dscores (in soft_cap_backward) has the contribution of the −tanh²(s / cap) · d_out term
#   cap or 2 (= 2) times its right value
import numpy as np


def soft_cap_forward(scores, cap):
    t = np.tanh(scores / cap)
    return cap * t, (t, cap)


def soft_cap_backward(d_out, cache):
    t, cap = cache
    return d_out - cap * t**2 * d_out  # "d/ds cap·tanh(s/cap) = 1 − cap·tanh²": the cap cancels with 1/cap
