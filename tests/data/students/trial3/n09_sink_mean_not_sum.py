# expect: FAIL
# where: sink_softmax_backward sink
# name: relation factor
"""Near sink_not_summed: the sink's per-row gradient is reduced to the sink's shape with a mean instead of a sum
(the student thinks of "the sink's average pull"), so d_sink is 1/(the rows sharing it) times the right one."""

import numpy as np


def sink_softmax_forward(x, sink):
    m = np.maximum(x.max(axis=-1), sink)
    e = np.exp(x - m[..., None])
    es = np.exp(sink - m)
    z = e.sum(-1) + es
    return e / z[..., None], (e / z[..., None], es / z, np.shape(sink))


def sink_softmax_backward(dp, cache):
    p, ps, shape = cache
    D = np.sum(p * dp, axis=-1)
    dx = p * (dp - D[..., None])
    ds = -ps * D
    lead = ds.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(lead + i for i, n in enumerate(shape) if n == 1)
    return dx, ds.mean(axis=axes, keepdims=True).reshape(shape)  # BUG: mean where a sum belongs
