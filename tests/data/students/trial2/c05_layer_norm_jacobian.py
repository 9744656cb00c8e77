# expect: PASS
"""Correct, unusual style: the LayerNorm backward through the explicit Jacobian of each row (slow, but right)."""

import numpy as np


def layer_norm_forward(x, gamma, beta, eps):
    mu = np.mean(x, axis=-1, keepdims=True)
    var = np.var(x, axis=-1, keepdims=True)
    xhat = (x - mu) / np.sqrt(var + eps)
    return gamma * xhat + beta, (x, gamma, eps)


def layer_norm_backward(d_out, cache):
    x, gamma, eps = cache
    E = x.shape[-1]
    rows, d_rows = x.reshape(-1, E), d_out.reshape(-1, E)  # (N, E)
    dx = np.empty_like(rows)
    dgamma, dbeta = np.zeros(E), np.zeros(E)
    eye = np.eye(E)
    for n in range(rows.shape[0]):
        c = rows[n] - rows[n].mean()
        s = np.sqrt(c @ c / E + eps)
        xh = c / s
        J = (eye - 1.0 / E) / s - np.outer(xh, xh) / (E * s)  # J[i, j] = d xhat_i / d x_j
        dx[n] = J.T @ (d_rows[n] * gamma)
        dgamma += d_rows[n] * xh
        dbeta += d_rows[n]
    return dx.reshape(x.shape), dgamma, dbeta
