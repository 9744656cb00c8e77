"""A student's attention that masks the weights after the softmax."""

# expect: scaled_dot_product_attention_forward mask_after_softmax
import numpy as np


def scaled_dot_product_attention_forward(q, k, v, mask):
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    p = e / e.sum(axis=-1, keepdims=True)
    if mask is not None:
        p = p * mask
    return p @ v, (q, k, v, p)
