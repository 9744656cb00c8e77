# expect: FAIL
# where: layer_norm_backward x
# name: relation cache
"""Outside the catalogue: the forward caches σ under the name the backward reads as 1/σ; the forward's output and
the backward's formula are both right."""

import numpy as np


def layer_norm_forward(x, gamma, beta, eps):
    mu = x.mean(axis=-1, keepdims=True)
    std = np.sqrt(x.var(axis=-1, keepdims=True) + eps)
    xhat = (x - mu) / std
    return xhat * gamma + beta, (xhat, std, gamma)  # BUG: the backward reads the second entry as rstd = 1/σ


def layer_norm_backward(d_out, cache):
    xhat, rstd, gamma = cache
    g = d_out * gamma
    dx = rstd * (g - g.mean(axis=-1, keepdims=True) - xhat * (g * xhat).mean(axis=-1, keepdims=True))
    rows = tuple(range(d_out.ndim - 1))
    return dx, (d_out * xhat).sum(axis=rows), d_out.sum(axis=rows)
