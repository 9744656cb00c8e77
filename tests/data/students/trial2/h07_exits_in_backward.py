# expect: FAIL
# where: layer_norm_backward
# name: hostile
"""Hostile: the backward ends the process with status 0 (os._exit skips every handler)."""

import os

import numpy as np


def layer_norm_forward(x, gamma, beta, eps):
    mu = x.mean(-1, keepdims=True)
    rstd = 1 / np.sqrt(x.var(-1, keepdims=True) + eps)
    return (x - mu) * rstd * gamma + beta, ((x - mu) * rstd, rstd, gamma)


def layer_norm_backward(d_out, cache):
    os._exit(0)
