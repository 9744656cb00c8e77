"""A student's sink backward with d_sink = +p_sink D."""

# expect: sink_softmax_backward sink_sign
import numpy as np


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
    d_sink = p_sink * D  # (...,): p_sink (0 - D)
    lead = d_sink.ndim - len(sink_shape)
    axes = tuple(range(lead)) + tuple(lead + i for i, n in enumerate(sink_shape) if n == 1)
    return dx, d_sink.sum(axis=axes, keepdims=True).reshape(sink_shape)  # summed over what the sink was shared by
