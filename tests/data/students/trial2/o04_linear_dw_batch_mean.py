# expect: FAIL
# where: linear_backward W
# name: relation factor the batch size
"""Outside the catalogue: the weight gradient averaged over the batch ("a gradient is a mean over examples")."""

import numpy as np


def linear_forward(x, W, b):
    return x @ W.T + b, (x, W)


def linear_backward(dy, cache):
    x, W = cache
    B = x.shape[0]
    lead = tuple(range(dy.ndim - 1))
    dW = np.tensordot(dy, x, axes=(lead, lead)) / B  # BUG: the forward has no mean; dW is the plain sum
    return dy @ W, dW, dy.sum(axis=lead)
