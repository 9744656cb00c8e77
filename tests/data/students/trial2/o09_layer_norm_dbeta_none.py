# expect: FAIL
# where: layer_norm_backward beta
# name: relation missing
"""Outside the catalogue: beta's gradient returned as None ("beta is just an offset")."""

import numpy as np


def layer_norm_forward(x, gamma, beta, eps):
    mu = x.mean(-1, keepdims=True)
    rstd = 1 / np.sqrt(x.var(-1, keepdims=True) + eps)
    xhat = (x - mu) * rstd
    return gamma * xhat + beta, (xhat, rstd, gamma)


def layer_norm_backward(d_out, cache):
    xhat, rstd, gamma = cache
    g = d_out * gamma
    dx = rstd * (g - g.mean(-1, keepdims=True) - xhat * (g * xhat).mean(-1, keepdims=True))
    dgamma = np.sum(d_out * xhat, axis=tuple(range(d_out.ndim - 1)))
    return dx, dgamma, None  # BUG: beta was added, it is owed d_out summed over the rows
