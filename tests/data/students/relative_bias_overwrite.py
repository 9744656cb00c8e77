"""A student's relative-position backward with fancy-index += (one write per column survives)."""

# expect: relative_position_bias_backward relative_bias_overwrite
import numpy as np


def relative_position_bias_forward(table, Lq, Lk):
    R = (table.shape[1] - 1) // 2
    dist = np.arange(Lk)[None, :] - np.arange(Lq)[:, None]  # (Lq, Lk): j - i
    idx = np.clip(dist, -R, R) + R  # (Lq, Lk): the table's column
    return table[:, idx][None], (idx, table.shape)


def relative_position_bias_backward(d_bias, cache):
    idx, shape = cache
    d = d_bias.sum(axis=0)  # (H, Lq, Lk): the bias was shared by the batch
    d_table = np.zeros(shape)
    d_table[:, idx] += d  # scatter-add: a column read many times gets every gradient
    return d_table
