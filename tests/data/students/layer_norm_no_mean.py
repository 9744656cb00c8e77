"""A student's LayerNorm backward: no_mean."""

# expect: layer_norm_backward layer_norm_no_mean
import numpy as np


def layer_norm_forward(x, gamma, beta, eps):
    mu = x.mean(axis=-1, keepdims=True)
    rstd = 1.0 / np.sqrt(((x - mu) ** 2).mean(axis=-1, keepdims=True) + eps)
    x_hat = (x - mu) * rstd
    return x_hat * gamma + beta, (x_hat, rstd, gamma)


def layer_norm_backward(d_out, cache):
    x_hat, rstd, gamma = cache
    axes = tuple(range(d_out.ndim - 1))
    dx_hat = d_out * gamma
    dx = rstd * (dx_hat - x_hat * (dx_hat * x_hat).mean(axis=-1, keepdims=True))
    return dx, (d_out * x_hat).sum(axis=axes), d_out.sum(axis=axes)
