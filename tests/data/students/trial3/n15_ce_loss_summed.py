# expect: FAIL
# where: softmax_cross_entropy_forward out
# name: relation factor
"""Near the cross-entropy mean, in the forward: the loss summed over the tokens, not averaged, and the backward made
to match it (no 1/N), so the pair agrees with itself and both are N times the course's."""

import numpy as np


def softmax_cross_entropy_forward(logits, targets):
    lse = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
    picked = np.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    p = np.exp(logits - lse[..., None])
    return float(np.sum(lse - picked)), (p, targets)  # BUG: a sum, the course's loss is the mean


def softmax_cross_entropy_backward(d_loss, cache):
    p, t = cache
    d = p.copy()
    np.put_along_axis(d, t[..., None], np.take_along_axis(p, t[..., None], -1) - 1.0, -1)
    return d_loss * d
