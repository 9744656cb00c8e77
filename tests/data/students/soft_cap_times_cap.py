"""A student's soft-cap backward that kept the outer cap (its forward caches cap too)."""

# expect: soft_cap_backward soft_cap_times_cap
import numpy as np


def soft_cap_forward(scores, cap):
    t = np.tanh(scores / cap)
    return cap * t, (t, cap)


def soft_cap_backward(d_out, cache):
    t, cap = cache
    return d_out * cap * (1.0 - t**2)
