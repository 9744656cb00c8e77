"""Solutions to exercises/ex04_mask_dropout.ipynb."""

import numpy as np


def apply_mask_forward(scores, mask):
    if mask.dtype == bool:
        out = np.where(mask, scores, -np.inf)  # True = may attend
    else:
        out = scores + mask  # a float mask is added
    return out, np.isneginf(out)


def apply_mask_backward(d_out, cache):
    blocked = cache
    return np.where(blocked, 0.0, d_out)  # a blocked score does not reach the output


def dropout_forward(x, p, rng, keep_mask):
    out = x * keep_mask / (1 - p)
    return out, (keep_mask, p)


def dropout_backward(d_out, cache):
    keep_mask, p = cache
    return d_out * keep_mask / (1 - p)
