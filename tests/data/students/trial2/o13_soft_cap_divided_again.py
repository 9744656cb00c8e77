# expect: FAIL
# where: soft_cap_backward scores
# name: relation factor cap
"""Outside the catalogue: the chain rule's 1/cap applied, and the outer cap forgotten (divided once too often)."""

import numpy as np


def soft_cap_forward(scores, cap):
    t = np.tanh(scores / cap)
    return cap * t, (t, cap)


def soft_cap_backward(d_out, cache):
    t, cap = cache
    return d_out * (1 - t**2) / cap  # BUG: cap · tanh' · 1/cap: the two caps cancel
