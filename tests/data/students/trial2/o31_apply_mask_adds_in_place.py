# expect: FAIL
# where: apply_mask_forward
# name: relation mutation
"""Outside the catalogue: a float mask added in place (scores += mask), so the caller's scores change; the bool
mask's branch makes a new array and is fine."""

import numpy as np


def apply_mask_forward(scores, mask):
    if mask.dtype == bool:
        return np.where(mask, scores, -np.inf), mask
    scores += mask  # BUG: writes into the caller's array
    return scores, None


def apply_mask_backward(d_out, cache):
    mask = cache
    return d_out if mask is None else np.where(mask, d_out, 0.0)
