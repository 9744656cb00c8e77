"""A student's LayerNorm backward whose dgamma is left per token (dx and dbeta right)."""

# relation: layer_norm_backward dgamma (in layer_norm_backward) has shape (2, 3, 6): it is the per-item part
import numpy as np


def layer_norm_forward(x, gamma, beta, eps):
    mu = x.mean(-1, keepdims=True)
    var = x.var(-1, keepdims=True)
    xhat = (x - mu) / np.sqrt(var + eps)
    return gamma * xhat + beta, (xhat, 1 / np.sqrt(var + eps), gamma)


def layer_norm_backward(d_out, cache):
    xhat, rstd, gamma = cache
    g = d_out * gamma  # (..., E): the gradient of x̂
    dx = rstd * (g - g.mean(-1, keepdims=True) - xhat * (g * xhat).mean(-1, keepdims=True))
    return dx, d_out * xhat, d_out.sum(axis=tuple(range(d_out.ndim - 1)))  # dgamma not summed over the tokens
