"""A student's scores pair that divides by the scale, forward and backward."""

# expect: attention_scores_forward scores_divide
# expect: attention_scores_backward scores_divide
import numpy as np


def attention_scores_forward(q, k, scale):
    return q @ np.swapaxes(k, -1, -2) / scale, (q, k, scale)


def attention_scores_backward(d_scores, cache):
    q, k, scale = cache
    dq = (d_scores / scale) @ k
    dk = np.swapaxes(d_scores / scale, -1, -2) @ q
    return dq, dk
