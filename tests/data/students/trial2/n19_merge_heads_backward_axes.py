# expect: FAIL
# where: merge_heads_backward x
# name: relation transpose
"""Near merge_heads_reshape: the backward reshapes right and transposes to (B, H, d, L); where L = d the shape
does not show it."""

import numpy as np


def merge_heads_forward(x):
    B, H, L, d = x.shape
    return np.ascontiguousarray(np.moveaxis(x, 1, 2)).reshape(B, L, H * d), (H, d)


def merge_heads_backward(d_out, cache):
    H, d = cache
    B, L, _ = d_out.shape
    return d_out.reshape(B, L, H, d).transpose(0, 2, 3, 1)  # BUG: (0, 2, 1, 3)
