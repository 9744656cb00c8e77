"""A student's scores backward written as a loop over the query rows that starts at 1."""

# relation: attention_scores_backward dq (in attention_scores_backward) is right except on the first row
import numpy as np


def attention_scores_forward(q, k, scale):
    return (q @ k.swapaxes(-1, -2)) * scale, (q, k, scale)


def attention_scores_backward(d_scores, cache):
    q, k, scale = cache
    dq = np.zeros_like(q)
    for i in range(1, q.shape[-2]):  # off by one: row 0 is never written
        dq[..., i, :] = np.einsum("...j,...jd->...d", d_scores[..., i, :] * scale, k)  # (Lk,) @ (Lk, d) -> (d,)
    dk = (d_scores * scale).swapaxes(-1, -2) @ q
    return dq, dk
