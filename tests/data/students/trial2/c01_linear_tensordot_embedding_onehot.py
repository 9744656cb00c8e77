# expect: PASS
"""Correct, unusual style: linear with einsum and np.tensordot over every leading axis; the embedding through a
one-hot matrix (its backward a product, so repeated ids add up without np.add.at)."""

import numpy as np


def linear_forward(x, W, b):
    y = np.einsum("...i,oi->...o", x, W) + b  # (..., in), (out, in) -> (..., out)
    return y, {"x": x, "W": W}


def linear_backward(dy, cache):
    x, W = cache["x"], cache["W"]
    dx = np.tensordot(dy, W, axes=([-1], [0]))  # (..., out) x (out, in) -> (..., in)
    lead = tuple(range(dy.ndim - 1))
    dW = np.tensordot(dy, x, axes=(lead, lead))  # (out, in): every leading axis contracted
    db = dy.sum(axis=lead)
    return dx, dW, db


def embedding_forward(ids, table):
    onehot = np.eye(table.shape[0])[ids]  # (..., V)
    return onehot @ table, onehot  # (..., V) @ (V, E) -> (..., E)


def embedding_backward(d_out, cache):
    onehot = cache
    V, E = onehot.shape[-1], d_out.shape[-1]
    return onehot.reshape(-1, V).T @ d_out.reshape(-1, E)  # (V, N) @ (N, E) -> (V, E)
