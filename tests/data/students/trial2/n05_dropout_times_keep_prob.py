# expect: FAIL
# where: dropout_backward x
# name: relation factor
"""Near dropout_no_scale: the backward multiplies by the keep probability instead of dividing by it."""

import numpy as np


def dropout_forward(x, p, rng, keep_mask):
    keep = 1.0 - p
    return np.where(keep_mask, x / keep, 0.0), (keep_mask, keep)


def dropout_backward(d_out, cache):
    keep_mask, keep = cache
    return np.where(keep_mask, d_out * keep, 0.0)  # BUG: the forward divided by keep
