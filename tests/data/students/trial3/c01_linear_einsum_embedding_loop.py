# expect: PASS
"""Correct, unusual style: the linear layer by einsum over any leading axes, the embedding's backward as a plain
Python loop over the flattened ids that adds row by row (so repeated ids accumulate)."""

import numpy as np


def linear_forward(x, W, b):
    out = np.einsum("...i,oi->...o", x, W)  # (..., in) x (out, in) -> (..., out)
    if b is not None:
        out = out + b
    return out, {"x": x, "W": W, "has_b": b is not None}


def linear_backward(dy, cache):
    x, W = cache["x"], cache["W"]
    dx = np.einsum("...o,oi->...i", dy, W)  # (..., out) x (out, in) -> (..., in)
    dW = np.einsum("no,ni->oi", dy.reshape(-1, dy.shape[-1]), x.reshape(-1, x.shape[-1]))  # (N, out), (N, in)
    db = np.einsum("no->o", dy.reshape(-1, dy.shape[-1])) if cache["has_b"] else None
    return dx, dW, db


def embedding_forward(ids, table):
    ids = np.asarray(ids)
    return table[ids], (ids, table.shape)


def embedding_backward(d_out, cache):
    ids, shape = cache
    d_table = np.zeros(shape, dtype=d_out.dtype)
    flat_ids = ids.reshape(-1)
    flat_d = d_out.reshape(-1, shape[-1])  # (N, E)
    for n in range(flat_ids.shape[0]):
        d_table[flat_ids[n]] += flat_d[n]  # one row at a time: a repeated id adds again
    return d_table
