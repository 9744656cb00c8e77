# expect: PASS
"""Correct, unusual style: the soft-cap's derivative as 1/cosh²; the sink as one more column of the softmax
(concatenated, then sliced off, its gradient reduced to the sink's shape by a helper); the relative-position bias
by loops over (i, j)."""

import numpy as np


def soft_cap_forward(scores, cap):
    return cap * np.tanh(scores / cap), (scores, cap)


def soft_cap_backward(d_out, cache):
    scores, cap = cache
    return d_out / np.cosh(scores / cap) ** 2


def _unbroadcast(g, shape):
    """Sum g down to ``shape`` (the shape it was broadcast from)."""
    while g.ndim > len(shape):
        g = g.sum(axis=0)
    for axis, n in enumerate(shape):
        if n == 1 and g.shape[axis] != 1:
            g = g.sum(axis=axis, keepdims=True)
    return g


def sink_softmax_forward(x, sink):
    column = np.broadcast_to(sink, x.shape[:-1])[..., None]  # (..., 1)
    z = np.concatenate([x, column], axis=-1)  # (..., Lk + 1)
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    full = e / e.sum(axis=-1, keepdims=True)
    return full[..., :-1], (full, np.shape(sink))


def sink_softmax_backward(dp, cache):
    full, sink_shape = cache
    dz = np.concatenate([dp, np.zeros(dp.shape[:-1] + (1,))], axis=-1)  # the sink's column had no dp
    d_full = full * (dz - (full * dz).sum(axis=-1, keepdims=True))
    return d_full[..., :-1], _unbroadcast(d_full[..., -1], sink_shape)


def relative_position_bias_forward(table, Lq, Lk):
    H, W = table.shape
    R = (W - 1) // 2
    out = np.empty((1, H, Lq, Lk))
    cols = np.empty((Lq, Lk), dtype=int)
    for i in range(Lq):
        for j in range(Lk):
            cols[i, j] = min(max(j - i, -R), R) + R
            out[0, :, i, j] = table[:, cols[i, j]]
    return out, (cols, table.shape)


def relative_position_bias_backward(d_bias, cache):
    cols, shape = cache
    d_table = np.zeros(shape)
    for i, j in np.ndindex(cols.shape):
        d_table[:, cols[i, j]] += d_bias[..., i, j].reshape(-1, shape[0]).sum(axis=0)
    return d_table
