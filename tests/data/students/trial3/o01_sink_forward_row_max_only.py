# expect: FAIL
# where: sink_softmax_forward out
# name: relation masked-rows
"""Outside the catalogue: the sink softmax shifted by the row's max of x only (the sink left out of the max, "any
shift is fine"), which is right everywhere except a fully masked row: there the max is -inf and -inf - (-inf) is
NaN, where the right weights are 0 (all the mass on the sink)."""

import numpy as np


def sink_softmax_forward(x, sink):
    shift = np.max(x, axis=-1, keepdims=True)  # BUG: -inf on a fully masked row
    ex = np.exp(x - shift)
    es = np.exp(np.broadcast_to(sink, x.shape[:-1])[..., None] - shift)
    denom = ex.sum(axis=-1, keepdims=True) + es
    p, p_sink = ex / denom, (es / denom)[..., 0]
    return p, (p, p_sink, np.shape(sink))


def sink_softmax_backward(dp, cache):
    p, p_sink, shape = cache
    D = (p * dp).sum(axis=-1)
    d_rows = -p_sink * D
    lead = d_rows.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(lead + i for i, n in enumerate(shape) if n == 1)
    return p * (dp - D[..., None]), d_rows.sum(axis=axes, keepdims=True).reshape(shape)
