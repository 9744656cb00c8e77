# expect: FAIL
# where: layer_norm_backward x
# name: relation wrong-axis
"""Near layer_norm's mean terms: the first mean of dx̂ is taken over axis 0 (the batch) instead of the features."""

import numpy as np


def layer_norm_forward(x, gamma, beta, eps):
    mu = x.mean(-1, keepdims=True)
    sigma = np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps)
    xhat = (x - mu) / sigma
    return xhat * gamma + beta, (xhat, sigma, gamma)


def layer_norm_backward(d_out, cache):
    xhat, sigma, gamma = cache
    E = xhat.shape[-1]
    dxhat = d_out * gamma
    dx = (dxhat - dxhat.mean(axis=0, keepdims=True) - xhat * (dxhat * xhat).mean(axis=-1, keepdims=True)) / sigma
    dgamma = (d_out * xhat).reshape(-1, E).sum(0)  # BUG above: axis=0 in the first mean
    dbeta = d_out.reshape(-1, E).sum(0)
    return dx, dgamma, dbeta
