# expect: FAIL
# where: embedding_backward table
# name: relation part | catalogue embedding_fancy_add
"""Near embedding_fancy_add: a loop over the distinct ids that copies the gradient of the id's first occurrence,
so a repeated token gets one of its gradients, not their sum."""

import numpy as np


def embedding_forward(ids, table):
    return np.take(table, ids, axis=0), (ids, table.shape)


def embedding_backward(d_out, cache):
    ids, shape = cache
    d_table = np.zeros(shape)
    flat = d_out.reshape(-1, shape[1])
    ids = np.asarray(ids).ravel()
    for token in np.unique(ids):
        first = np.flatnonzero(ids == token)[0]
        d_table[token] = flat[first]  # BUG: one occurrence, not all of them
    return d_table
