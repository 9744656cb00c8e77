# expect: FAIL
# where: attention_scores_forward out
# name: hostile
"""Hostile: returns an ndarray subclass whose comparisons and differences say "equal" to anything; its values are
zeros."""

import numpy as np


class Agreeable(np.ndarray):
    def __sub__(self, other):
        return np.zeros(np.broadcast_shapes(self.shape, np.shape(other))).view(Agreeable)

    __rsub__ = __sub__

    def __eq__(self, other):
        return np.ones(np.broadcast_shapes(self.shape, np.shape(other)), dtype=bool)

    def __array_finalize__(self, obj):
        pass


def attention_scores_forward(q, k, scale):
    return np.zeros(q.shape[:-1] + (k.shape[-2],)).view(Agreeable), (q, k, scale)


def attention_scores_backward(d_scores, cache):
    q, k, scale = cache
    return np.zeros_like(q).view(Agreeable), np.zeros_like(k).view(Agreeable)
