# expect: FAIL
# where: attention_context_backward v
# name: relation head
"""Outside the catalogue: a loop over the heads whose dv reads the weights of head 0 for every head."""

import numpy as np


def attention_context_forward(p, v):
    return p @ v, (p, v)


def attention_context_backward(d_context, cache):
    p, v = cache
    dp = d_context @ v.swapaxes(-1, -2)
    dv = np.empty_like(v)
    for h in range(v.shape[1]):
        dv[:, h] = p[:, 0].swapaxes(-1, -2) @ d_context[:, h]  # BUG: p[:, h]
    return dp, dv
