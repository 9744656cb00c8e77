"""A student's repeat_kv backward that reads the first query head of each group."""

# expect: repeat_kv_backward repeat_kv_first_head
import numpy as np


def repeat_kv_forward(x, n_rep):
    return np.repeat(x, n_rep, axis=1), (x.shape, n_rep)


def repeat_kv_backward(d_out, cache):
    (B, Hkv, L, d), n_rep = cache
    return d_out[:, ::n_rep]
