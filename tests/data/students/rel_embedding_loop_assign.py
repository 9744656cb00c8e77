"""A student's embedding backward written as a loop that assigns each row: a repeated id keeps only its last row."""

# relation: embedding_backward dtable (in embedding_backward) is wrong only on the rows of ids that occur more than once
import numpy as np


def embedding_forward(ids, table):
    return table[ids], (ids, table.shape)  # (..., E)


def embedding_backward(d_out, cache):
    ids, shape = cache
    d_table = np.zeros(shape)
    for i, row in zip(ids.ravel(), d_out.reshape(-1, shape[-1])):  # (N,), (N, E)
        d_table[i] = row  # "the row of token i gets its gradient": a second occurrence overwrites the first
    return d_table
