# expect: FAIL
# where: attention_scores_backward q
# name: relation order
"""Outside the catalogue: both gradients right, returned in the wrong order (dk, dq)."""

import numpy as np


def attention_scores_forward(q, k, scale):
    return np.einsum("bhid,bhjd->bhij", q, k) * scale, (q, k, scale)


def attention_scores_backward(d_scores, cache):
    q, k, scale = cache
    dq = np.einsum("bhij,bhjd->bhid", d_scores, k) * scale
    dk = np.einsum("bhij,bhid->bhjd", d_scores, q) * scale
    return dk, dq  # BUG: the forward's order is (q, k)
