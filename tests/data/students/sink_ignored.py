"""A student's sink softmax that leaves the sink out of the denominator."""

# expect: sink_softmax_forward sink_ignored
import numpy as np


def sink_softmax_forward(x, sink):
    m = np.maximum(x.max(axis=-1), sink)  # (...,): the row max, the sink included (finite: the sink is)
    e = np.exp(x - m[..., None])  # (..., Lk), exp(-inf) = 0 for a blocked key
    e_sink = np.exp(sink - m)  # (...,)
    total = e.sum(axis=-1)
    return e / total[..., None], (e / total[..., None], e_sink / total, np.shape(sink))
