# expect: FAIL
# where: embedding_backward table
# name: catalogue embedding_fancy_add
"""The fancy-index overwrite written as a loop: each token's row assigned, so a repeated id keeps its last write."""

import numpy as np


def embedding_forward(ids, table):
    return table[ids], (ids, table.shape)


def embedding_backward(d_out, cache):
    ids, shape = cache
    d_table = np.zeros(shape)
    for pos in np.ndindex(ids.shape):
        d_table[ids[pos]] = d_out[pos]  # BUG: = where += belongs
    return d_table
