# expect: PASS
"""Correct, unusual style: the heads cut by a loop of slices and np.stack, merged by np.concatenate; the backward
of each the other's forward."""

import numpy as np


def split_heads_forward(x, num_heads):
    d = x.shape[-1] // num_heads
    heads = []
    for h in range(num_heads):
        heads.append(x[:, :, h * d : (h + 1) * d])  # (B, L, d)
    return np.stack(heads, axis=1), num_heads  # (B, H, L, d)


def split_heads_backward(d_out, cache):
    num_heads = cache
    return np.concatenate([d_out[:, h] for h in range(num_heads)], axis=-1)  # (B, L, H*d)


def merge_heads_forward(x):
    per_head = list(np.moveaxis(x, 1, 0))  # H arrays (B, L, d)
    return np.concatenate(per_head, axis=-1), x.shape[1]  # (B, L, H*d)


def merge_heads_backward(d_out, cache):
    num_heads = cache
    return np.stack(np.split(d_out, num_heads, axis=-1), axis=1)  # (B, H, L, d)
