"""A student's repeat_kv backward that reads the last query head of each group instead of summing the group."""

# relation: repeat_kv_backward dx (in repeat_kv_backward) lacks the contributions of copy 0 of each group
import numpy as np


def repeat_kv_forward(x, n_rep):
    return np.repeat(x, n_rep, axis=1), n_rep  # query head h reads k/v head h // n_rep


def repeat_kv_backward(d_out, cache):
    n_rep = cache
    return d_out[:, n_rep - 1 :: n_rep]  # (B, Hkv, L, d): one copy, the group's sum belongs
