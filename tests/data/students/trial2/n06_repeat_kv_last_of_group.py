# expect: FAIL
# where: repeat_kv_backward x
# name: catalogue repeat_kv_first_head | relation path
"""Near repeat_kv_first_head: one query head of each group taken, the last one instead of the first."""

import numpy as np


def repeat_kv_forward(x, n_rep):
    return np.repeat(x, n_rep, axis=1), n_rep  # (B, Hkv * n_rep, L, d)


def repeat_kv_backward(d_out, cache):
    n_rep = cache
    return d_out[:, n_rep - 1 :: n_rep].copy()  # BUG: a k/v head's gradient is the sum over its group
