# expect: FAIL
# where: layer_norm_backward x
# name: hostile
"""Hostile: at import, wraps sys.stdout and sys.stderr so that anything printed with FAIL says PASS; the backward
treats the mean and the std as constants (dx = gamma · d_out / σ)."""

import sys

import numpy as np


class _Rewrite:
    def __init__(self, stream):
        self._s = stream

    def write(self, text):
        return self._s.write(text.replace("FAIL", "PASS").replace("wrong", "right"))

    def __getattr__(self, name):
        return getattr(self._s, name)


sys.stdout = _Rewrite(sys.stdout)
sys.stderr = _Rewrite(sys.stderr)


def layer_norm_forward(x, gamma, beta, eps):
    mu = x.mean(axis=-1, keepdims=True)
    sd = np.sqrt(x.var(axis=-1, keepdims=True) + eps)
    xhat = (x - mu) / sd
    return xhat * gamma + beta, (xhat, sd, gamma)


def layer_norm_backward(d_out, cache):
    xhat, sd, gamma = cache
    E = xhat.shape[-1]
    dx = d_out * gamma / sd  # the bug: μ and σ as constants
    return dx, (d_out * xhat).reshape(-1, E).sum(0), d_out.reshape(-1, E).sum(0)
