# expect: PASS
"""Correct, unusual style: the sink softmax as an ordinary softmax over the row with the sink appended as one more
column (then dropped), its backward through that wider softmax; soft-cap's derivative as 1 / cosh²; the
relative-position table's gradient by a loop over the table's columns with boolean masks."""

import numpy as np


def sink_softmax_forward(x, sink):
    s = np.broadcast_to(sink, x.shape[:-1])[..., None]  # (..., 1): one more logit per row
    z = np.concatenate([x, s], axis=-1)  # (..., Lk + 1)
    z = z - z.max(axis=-1, keepdims=True)  # finite: the sink column is
    e = np.exp(z)
    full = e / e.sum(axis=-1, keepdims=True)
    return full[..., :-1], (full, np.shape(sink))


def sink_softmax_backward(dp, cache):
    full, sink_shape = cache
    dfull = np.concatenate([dp, np.zeros(dp.shape[:-1] + (1,))], axis=-1)  # the sink column has no value
    dz = full * (dfull - (full * dfull).sum(axis=-1, keepdims=True))
    d_sink_rows = dz[..., -1]  # (...,)
    extra = d_sink_rows.ndim - len(sink_shape)
    d_sink = d_sink_rows.sum(axis=tuple(range(extra))) if extra > 0 else d_sink_rows
    for ax, n in enumerate(sink_shape):
        if n == 1:
            d_sink = d_sink.sum(axis=ax, keepdims=True)
    return dz[..., :-1], d_sink.reshape(sink_shape)


def soft_cap_forward(scores, cap):
    return cap * np.tanh(scores / cap), (scores, cap)


def soft_cap_backward(d_out, cache):
    scores, cap = cache
    return d_out / np.cosh(scores / cap) ** 2


def relative_position_bias_forward(table, Lq, Lk):
    R = (table.shape[1] - 1) // 2
    rel = np.subtract.outer(np.arange(Lk), np.arange(Lq)).T  # (Lq, Lk): j - i
    col = np.clip(rel, -R, R) + R
    return table[:, col][None], (col, table.shape)


def relative_position_bias_backward(d_bias, cache):
    col, shape = cache
    total = d_bias.sum(axis=0)  # (H, Lq, Lk)
    d_table = np.zeros(shape)
    for c in range(shape[1]):
        d_table[:, c] = total[:, col == c].sum(axis=-1)  # every (i, j) that read column c
    return d_table
