# expect: FAIL
# where: relative_position_bias_backward table
# name: relation sum-extra
"""Outside the catalogue: d_bias summed over the batch and the heads, then scattered into every head's row of the
table (each head has a row of its own)."""

import numpy as np


def relative_position_bias_forward(table, Lq, Lk):
    R = (table.shape[1] - 1) // 2
    idx = np.clip(np.arange(Lk)[None, :] - np.arange(Lq)[:, None], -R, R) + R  # (Lq, Lk)
    return table[:, idx][None], (idx, table.shape)


def relative_position_bias_backward(d_bias, cache):
    idx, shape = cache
    d = d_bias.sum(axis=(0, 1))  # BUG: (Lq, Lk), the heads summed together
    d_table = np.zeros(shape)
    for h in range(shape[0]):
        np.add.at(d_table[h], idx, d)
    return d_table
