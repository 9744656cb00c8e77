"""A student's sink backward that sums the sink's gradient over the heads too (each head has its own sink)."""

# relation: sink_softmax_backward dsink (in sink_softmax_backward) is summed over axes (0,), a sum too many
import numpy as np


def sink_softmax_forward(x, sink):
    m = np.maximum(x.max(axis=-1), sink)
    e = np.exp(x - m[..., None])
    e_sink = np.exp(sink - m)
    total = e.sum(axis=-1) + e_sink
    return e / total[..., None], (e / total[..., None], e_sink / total, np.shape(sink))


def sink_softmax_backward(dp, cache):
    p, p_sink, sink_shape = cache
    D = (p * dp).sum(axis=-1)
    dx = p * (dp - D[..., None])
    return dx, np.full(sink_shape, (-p_sink * D).sum())  # every sink gets the total
