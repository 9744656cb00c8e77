"""A student's sink backward that returns zeros for the sink's gradient (a near-variant of returning dx only)."""

# relation: sink_softmax_backward dsink (in sink_softmax_backward) is all zeros
import numpy as np


def sink_softmax_forward(x, sink):
    m = np.maximum(x.max(axis=-1), sink)  # (...,): the row max, the sink included
    e = np.exp(x - m[..., None])  # (..., Lk)
    e_sink = np.exp(sink - m)  # (...,)
    total = e.sum(axis=-1) + e_sink
    return e / total[..., None], (e / total[..., None], np.shape(sink))


def sink_softmax_backward(dp, cache):
    p, sink_shape = cache
    dx = p * (dp - (p * dp).sum(axis=-1, keepdims=True))
    return dx, np.zeros(sink_shape)  # "the sink is a constant of the row": it is a parameter, it learns
