# expect: FAIL
# where: layer_norm_backward gamma
# name: relation sum-missing
"""Near bias_batch_only, on LayerNorm's gamma: dgamma summed over axis 0 only, so for (B, L, E) it keeps one row
per position."""

import numpy as np


def layer_norm_forward(x, gamma, beta, eps):
    mu = np.mean(x, axis=-1, keepdims=True)
    var = np.var(x, axis=-1, keepdims=True)
    rstd = (var + eps) ** -0.5
    xhat = (x - mu) * rstd
    return gamma * xhat + beta, (xhat, rstd, gamma)


def layer_norm_backward(d_out, cache):
    xhat, rstd, gamma = cache
    dgamma = np.sum(d_out * xhat, axis=0)  # BUG: the batch axis only
    dbeta = d_out.reshape(-1, d_out.shape[-1]).sum(axis=0)
    dxhat = d_out * gamma
    dx = rstd * (dxhat - dxhat.mean(-1, keepdims=True) - xhat * (dxhat * xhat).mean(-1, keepdims=True))
    return dx, dgamma, dbeta
