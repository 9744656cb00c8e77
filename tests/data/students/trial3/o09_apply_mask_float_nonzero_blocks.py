# expect: FAIL
# where: apply_mask_backward scores
# name: relation part | relation missing
"""Outside the catalogue: the backward rebuilds "blocked" from the mask as "mask is False or mask is nonzero", so a
float mask's finite entries (a bias added, not a block) stop the gradient too: wrong exactly on the entries a
finite nonzero float mask touched."""

import numpy as np


def apply_mask_forward(scores, mask):
    if mask.dtype == np.bool_:
        return np.where(mask, scores, -np.inf), mask
    return scores + mask, mask


def apply_mask_backward(d_out, cache):
    mask = cache
    blocked = ~mask if mask.dtype == np.bool_ else (mask != 0)  # BUG: any nonzero float entry counted as blocked
    return np.where(np.broadcast_to(blocked, d_out.shape), 0.0, d_out)
