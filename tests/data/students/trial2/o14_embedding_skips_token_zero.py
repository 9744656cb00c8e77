# expect: FAIL
# where: embedding_backward table
# name: relation part
"""Outside the catalogue: the table's gradient built token by token from 1 ("0 is padding"), so row 0 stays zero
though token 0 is a real token here."""

import numpy as np


def embedding_forward(ids, table):
    return np.take(table, ids, axis=0), (ids, table.shape[0])


def embedding_backward(d_out, cache):
    ids, V = cache
    rows = d_out.reshape(-1, d_out.shape[-1])
    flat = ids.reshape(-1)
    d_table = np.zeros((V, rows.shape[1]))
    for token in range(1, V):  # BUG: token 0 is used too
        d_table[token] = rows[flat == token].sum(axis=0)
    return d_table
