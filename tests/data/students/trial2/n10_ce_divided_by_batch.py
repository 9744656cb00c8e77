# expect: FAIL
# where: softmax_cross_entropy_backward logits
# name: relation factor
"""Near cross_entropy_no_mean: divided by the batch size B instead of the N = B·L tokens."""

import numpy as np


def softmax_cross_entropy_forward(logits, targets):
    z = logits - logits.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    return float(-np.take_along_axis(logp, targets[..., None], -1).mean()), (np.exp(logp), targets)


def softmax_cross_entropy_backward(d_loss, cache):
    p, targets = cache
    d = p.copy()
    B, L = targets.shape
    for b in range(B):
        for i in range(L):
            d[b, i, targets[b, i]] -= 1
    return d * d_loss / B  # BUG: the mean ran over B * L tokens
