"""Solutions to exercises/ex12_bias_softcap_sinks_backward.ipynb."""

import numpy as np


def relative_position_bias_forward(table, Lq, Lk):
    R = (table.shape[1] - 1) // 2
    dist = np.arange(Lk)[None, :] - np.arange(Lq)[:, None]  # (Lq, Lk): j - i
    idx = np.clip(dist, -R, R) + R  # (Lq, Lk): the table's column
    return table[:, idx][None], (idx, table.shape)  # (1, H, Lq, Lk)


def relative_position_bias_backward(d_bias, cache):
    idx, shape = cache
    d = d_bias.sum(axis=0)  # (H, Lq, Lk): the bias was shared by the batch
    d_table = np.zeros(shape)
    np.add.at(d_table, (slice(None), idx), d)  # scatter-add: a column read many times gets every gradient
    return d_table


def soft_cap_forward(scores, cap):
    t = np.tanh(scores / cap)
    return cap * t, t


def soft_cap_backward(d_out, cache):
    t = cache
    return d_out * (1.0 - t**2)  # cap · tanh'(s / cap) · (1 / cap)


def sink_softmax_forward(x, sink):
    m = np.maximum(x.max(axis=-1), sink)  # (...,): the row max, the sink included (finite: the sink is)
    e = np.exp(x - m[..., None])  # (..., Lk), exp(-inf) = 0 for a blocked key
    e_sink = np.exp(sink - m)  # (...,)
    total = e.sum(axis=-1) + e_sink
    return e / total[..., None], (e / total[..., None], e_sink / total, np.shape(sink))


def sink_softmax_backward(dp, cache):
    p, p_sink, sink_shape = cache
    D = (p * dp).sum(axis=-1)  # (...,): the sink's dp is 0, so it adds nothing here
    dx = p * (dp - D[..., None])
    d_sink = -p_sink * D  # (...,): p_sink (0 - D)
    lead = d_sink.ndim - len(sink_shape)
    axes = tuple(range(lead)) + tuple(lead + i for i, n in enumerate(sink_shape) if n == 1)
    return dx, d_sink.sum(axis=axes, keepdims=True).reshape(sink_shape)  # summed over what the sink was shared by
