"""A student's repeat_kv in np.tile's order, forward and backward consistent with each other."""

# expect: repeat_kv_forward repeat_kv_tiled
# expect: repeat_kv_backward repeat_kv_tiled
import numpy as np


def repeat_kv_forward(x, n_rep):
    return np.tile(x, (1, n_rep, 1, 1)), (x.shape, n_rep)


def repeat_kv_backward(d_out, cache):
    (B, Hkv, L, d), n_rep = cache
    return d_out.reshape(B, n_rep, Hkv, L, d).sum(axis=1)
