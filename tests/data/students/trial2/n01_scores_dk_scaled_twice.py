# expect: FAIL
# where: attention_scores_backward dk
# name: relation factor 1/scale
"""Near scores_no_scale: the scale is applied once to dS and then once more on dk only."""

import numpy as np


def attention_scores_forward(q, k, scale):
    return q @ np.swapaxes(k, -1, -2) * scale, (q, k, scale)  # (B, H, Lq, Lk)


def attention_scores_backward(d_scores, cache):
    q, k, scale = cache
    d_raw = d_scores * scale
    dq = d_raw @ k  # (Lq, Lk) @ (Lk, d)
    dk = (np.swapaxes(d_raw, -1, -2) * scale) @ q  # BUG: scale already in d_raw
    return dq, dk
