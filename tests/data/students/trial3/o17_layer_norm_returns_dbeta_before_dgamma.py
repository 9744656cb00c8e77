# expect: FAIL
# where: layer_norm_backward gamma
# name: relation order
"""Outside the catalogue: the backward returns (dx, dbeta, dgamma), "x, then the bias, then the weight", where the
course's order is the forward's arguments (x, gamma, beta); both have shape (E,), so nothing complains."""

import numpy as np


def layer_norm_forward(x, gamma, beta, eps):
    centred = x - x.mean(axis=-1, keepdims=True)
    inv = 1.0 / np.sqrt(np.mean(centred**2, axis=-1, keepdims=True) + eps)
    xhat = centred * inv
    return gamma * xhat + beta, (xhat, inv, gamma)


def layer_norm_backward(d_out, cache):
    xhat, inv, gamma = cache
    axes = tuple(range(d_out.ndim - 1))
    dgamma = np.sum(d_out * xhat, axis=axes)
    dbeta = np.sum(d_out, axis=axes)
    gx = d_out * gamma
    dx = inv * (gx - gx.mean(-1, keepdims=True) - xhat * np.mean(gx * xhat, -1, keepdims=True))
    return dx, dbeta, dgamma  # BUG: the forward's order is gamma, then beta
