"""Solutions to exercises/ex08_layer_norm.ipynb."""

import numpy as np


def layer_norm_forward(x, gamma, beta, eps):
    mu = x.mean(axis=-1, keepdims=True)  # (..., 1)
    xc = x - mu
    inv_std = 1.0 / np.sqrt((xc**2).mean(axis=-1, keepdims=True) + eps)  # (..., 1)
    xhat = xc * inv_std  # (..., E)
    return xhat * gamma + beta, (xhat, inv_std, gamma)


def layer_norm_backward(d_out, cache):
    xhat, inv_std, gamma = cache
    E = xhat.shape[-1]
    rows = d_out.reshape(-1, E)
    dgamma = (rows * xhat.reshape(-1, E)).sum(axis=0)  # (E,)
    dbeta = rows.sum(axis=0)  # (E,)
    g = d_out * gamma  # gradient with respect to xhat
    dx = inv_std * (g - g.mean(axis=-1, keepdims=True) - xhat * (g * xhat).mean(axis=-1, keepdims=True))
    return dx, dgamma, dbeta
