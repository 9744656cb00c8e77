"""A student's LayerNorm forward that scales by gamma and forgets to shift by beta (the backward, right, is checked on
the reference forward's cache)."""

# relation: layer_norm_forward out (of layer_norm_forward) lacks the contribution of the bias beta
import numpy as np


def layer_norm_forward(x, gamma, beta, eps):
    xhat = (x - x.mean(axis=-1, keepdims=True)) / np.sqrt(x.var(axis=-1, keepdims=True) + eps)
    return gamma * xhat, (xhat, gamma)
