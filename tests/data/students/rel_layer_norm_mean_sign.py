"""A student's LayerNorm backward that adds the mean's term instead of subtracting it."""

# relation: layer_norm_backward dx (in layer_norm_backward) has the contribution of the mean's path (−rstd ·
#   mean(dx̂)) with the wrong sign
import numpy as np


def layer_norm_forward(x, gamma, beta, eps):
    xc = x - x.mean(axis=-1, keepdims=True)
    rstd = (np.mean(xc * xc, axis=-1, keepdims=True) + eps) ** -0.5
    return xc * rstd * gamma + beta, (xc * rstd, rstd, gamma)


def layer_norm_backward(d_out, cache):
    xhat, rstd, gamma = cache
    E = xhat.shape[-1]
    g = d_out * gamma
    dx = rstd * (g + g.mean(axis=-1, keepdims=True) - xhat * (g * xhat).mean(axis=-1, keepdims=True))
    rows = lambda t: t.reshape(-1, E)  # noqa: E731
    return dx, (rows(d_out) * rows(xhat)).sum(0), rows(d_out).sum(0)
