# expect: FAIL
# where: soft_cap_backward scores
# name: relation cache
"""Outside the catalogue: the forward caches its output cap · tanh(s / cap) where the backward expects tanh(s / cap)
itself (the student reuses "the output, as for the softmax"): the backward's formula is right, its cache is not."""

import numpy as np


def soft_cap_forward(scores, cap):
    out = cap * np.tanh(scores / cap)
    return out, out  # BUG: the backward wants tanh(scores / cap), not cap times it


def soft_cap_backward(d_out, cache):
    t = cache
    return d_out * (1 - t * t)
