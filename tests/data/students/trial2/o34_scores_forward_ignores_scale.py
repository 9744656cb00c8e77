# expect: FAIL
# where: attention_scores_forward out
# name: relation factor
"""Outside the catalogue: the forward uses 1/√d and ignores the scale it is given (equal when scale = 1/√d, as in the
first case; not in the second)."""

import numpy as np


def attention_scores_forward(q, k, scale):
    s = q @ k.swapaxes(-1, -2) / np.sqrt(q.shape[-1])  # BUG: the argument scale is the factor
    return s, (q, k, 1.0 / np.sqrt(q.shape[-1]))


def attention_scores_backward(d_scores, cache):
    q, k, scale = cache
    return d_scores @ k * scale, d_scores.swapaxes(-1, -2) @ q * scale
