# expect: FAIL
# where: layer_norm_backward x
# name: relation wrong-axis
"""Outside the catalogue: the mean term of the backward taken over axis 0 (the batch) with keepdims, where the
forward's mean ran over the features (axis -1)."""

import numpy as np


def layer_norm_forward(x, gamma, beta, eps):
    mu = x.mean(axis=-1, keepdims=True)
    rstd = 1.0 / np.sqrt(((x - mu) ** 2).mean(axis=-1, keepdims=True) + eps)
    xhat = (x - mu) * rstd
    return xhat * gamma + beta, (xhat, rstd, gamma)


def layer_norm_backward(d_out, cache):
    xhat, rstd, gamma = cache
    g = d_out * gamma
    dx = rstd * (g - g.mean(axis=0, keepdims=True) - xhat * (g * xhat).mean(axis=-1, keepdims=True))  # BUG: axis
    rows = tuple(range(d_out.ndim - 1))
    return dx, (d_out * xhat).sum(axis=rows), d_out.sum(axis=rows)
