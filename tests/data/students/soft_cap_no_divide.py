"""A student's soft-cap forward without the division inside the tanh."""

# expect: soft_cap_forward soft_cap_no_divide
import numpy as np


def soft_cap_forward(scores, cap):
    t = np.tanh(scores / cap)
    return cap * np.tanh(scores), t
