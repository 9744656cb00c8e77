# expect: FAIL
# where: sink_softmax_backward sink
# name: relation sum-extra
"""Near sink_not_summed, the other way: the per-row sink gradient summed over everything (heads included) and
broadcast back to the sink's shape, so every head's sink gets the total of all heads."""

import numpy as np


def sink_softmax_forward(x, sink):
    full_sink = np.broadcast_to(sink, x.shape[:-1])
    m = np.maximum(np.max(x, axis=-1), full_sink)
    ex = np.exp(x - m[..., None])
    es = np.exp(full_sink - m)
    Z = ex.sum(-1) + es
    return ex / Z[..., None], (ex / Z[..., None], es / Z, np.shape(sink))


def sink_softmax_backward(dp, cache):
    p, p_sink, shape = cache
    D = np.einsum("...k,...k->...", p, dp)
    dx = p * (dp - D[..., None])
    d_sink = np.full(shape, np.sum(-p_sink * D))  # BUG: one total for every head's sink
    return dx, d_sink
