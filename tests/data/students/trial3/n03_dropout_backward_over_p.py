# expect: FAIL
# where: dropout_backward x
# name: relation factor
"""Near dropout_no_scale: the backward divides by p (the drop probability) where the forward divided by 1 - p."""

import numpy as np


def dropout_forward(x, p, rng, keep_mask):
    scale = 1.0 / (1.0 - p)
    return np.where(keep_mask, x * scale, 0.0), (keep_mask, p)


def dropout_backward(d_out, cache):
    keep_mask, p = cache
    return np.where(keep_mask, d_out / p, 0.0)  # BUG: p where 1 - p belongs
