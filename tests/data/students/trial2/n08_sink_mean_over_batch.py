# expect: FAIL
# where: sink_softmax_backward sink
# name: relation factor the batch size
"""Near sink_not_summed: the sink's gradient summed over the rows but averaged over the batch."""

import numpy as np


def sink_softmax_forward(x, sink):
    m = np.maximum(x.max(axis=-1), sink)
    e = np.exp(x - m[..., None])
    e_sink = np.exp(sink - m)
    total = e.sum(axis=-1) + e_sink
    return e / total[..., None], (e / total[..., None], e_sink / total, np.shape(sink))


def sink_softmax_backward(dp, cache):
    p, p_sink, sink_shape = cache
    D = (p * dp).sum(axis=-1)  # (B, H, Lq)
    dx = p * (dp - D[..., None])
    d_sink = (-p_sink * D).mean(axis=0)  # BUG: the batch shares the sink too: sum, not mean
    return dx, d_sink.sum(axis=-1, keepdims=True).reshape(sink_shape)
