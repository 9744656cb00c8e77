"""A student's context backward whose dv multiplies the weights untransposed: with Lq ≠ Lk the product cannot be
formed (the error is what the checker reads)."""

# relation: attention_context_backward attention_context_backward raised: a matrix product whose inner sizes differ
import numpy as np


def attention_context_forward(p, v):
    return np.matmul(p, v), (p, v)  # (B, H, Lq, Lk) @ (B, H, Lk, dv)


def attention_context_backward(d_out, cache):
    p, v = cache
    dp = np.matmul(d_out, np.swapaxes(v, -1, -2))  # (B, H, Lq, dv) @ (B, H, dv, Lk)
    dv = np.matmul(p, d_out)  # (Lq, Lk) @ (Lq, dv): the weights need their transpose
    return dp, dv
