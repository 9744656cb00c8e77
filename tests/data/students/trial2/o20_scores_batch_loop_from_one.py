# expect: FAIL
# where: attention_scores_backward q
# name: relation part
"""Outside the catalogue: a loop over the batch that starts at 1, so the first sequence gets no gradient."""

import numpy as np


def attention_scores_forward(q, k, scale):
    return np.matmul(q, np.swapaxes(k, -1, -2)) * scale, (q, k, scale)


def attention_scores_backward(d_scores, cache):
    q, k, scale = cache
    dq, dk = np.zeros(q.shape), np.zeros(k.shape)
    for b in range(1, q.shape[0]):  # BUG: range(B)
        dq[b] = d_scores[b] @ k[b] * scale
        dk[b] = np.swapaxes(d_scores[b], -1, -2) @ q[b] * scale
    return dq, dk
