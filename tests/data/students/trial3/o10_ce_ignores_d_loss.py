# expect: FAIL
# where: softmax_cross_entropy_backward logits
# name: relation factor
"""Outside the catalogue: the loss is the last node, so the student's backward starts from "1" and ignores the
upstream d_loss it is given (right only when d_loss = 1)."""

import numpy as np


def softmax_cross_entropy_forward(logits, targets):
    z = logits - logits.max(-1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(-1, keepdims=True)
    n = targets.size
    loss = -np.log(np.take_along_axis(p, targets[..., None], -1)).sum() / n
    return float(loss), (p, targets)


def softmax_cross_entropy_backward(d_loss, cache):
    p, targets = cache
    d = p.copy()
    np.put_along_axis(d, targets[..., None], np.take_along_axis(d, targets[..., None], -1) - 1, -1)
    return d / targets.size  # BUG: d_loss never used
