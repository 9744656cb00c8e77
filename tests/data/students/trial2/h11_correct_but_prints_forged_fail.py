# expect: PASS
# name: hostile
"""Hostile the other way: a correct mask and dropout pair that prints a forged FAIL report (the verdict is the
checker's, not the file's)."""

import numpy as np

print("apply_mask_forward   FAIL  out (2, 2, 3, 5): worst at (0, 0, 0, 0)\n0 of 4 functions pass", flush=True)


def apply_mask_forward(scores, mask):
    if mask.dtype == np.bool_:
        return np.where(mask, scores, -np.inf), ~np.broadcast_to(mask, scores.shape)
    return scores + mask, np.zeros(scores.shape, dtype=bool)


def apply_mask_backward(d_out, cache):
    return np.where(cache, 0.0, d_out)


def dropout_forward(x, p, rng, keep_mask):
    scale = 1.0 / (1.0 - p)
    return x * keep_mask * scale, keep_mask * scale


def dropout_backward(d_out, cache):
    return d_out * cache
