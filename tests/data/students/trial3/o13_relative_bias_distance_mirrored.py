# expect: FAIL
# where: relative_position_bias_forward out
# name: relation transpose | relation order
"""Outside the catalogue: the distance taken as i - j (query minus key) where the course's table is indexed by
j - i, so every query reads the table mirrored (the column of distance +r for -r); the backward scatters with the
same mirrored index, so the pair agrees with itself and a finite-difference check of it passes."""

import numpy as np


def relative_position_bias_forward(table, Lq, Lk):
    H, C = table.shape
    R = (C - 1) // 2
    i = np.arange(Lq)[:, None]
    j = np.arange(Lk)[None, :]
    col = np.clip(i - j, -R, R) + R  # BUG: i - j, the course uses j - i
    return table[:, col][np.newaxis], (col, C)


def relative_position_bias_backward(d_bias, cache):
    col, C = cache
    g = d_bias.sum(axis=0)  # (H, Lq, Lk)
    out = np.zeros((g.shape[0], C))
    for h in range(g.shape[0]):
        out[h] = np.bincount(col.ravel(), weights=g[h].ravel(), minlength=C)
    return out
