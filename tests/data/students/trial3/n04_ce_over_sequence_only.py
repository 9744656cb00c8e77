# expect: FAIL
# where: softmax_cross_entropy_backward logits
# name: relation factor the batch size
"""Near the cross-entropy mean: the backward divides by the last axis of the targets (L) instead of every token
(B·L), so for (B, L) targets it is B times too large."""

import numpy as np


def softmax_cross_entropy_forward(logits, targets):
    shifted = logits - np.max(logits, axis=-1, keepdims=True)
    logp = shifted - np.log(np.sum(np.exp(shifted), axis=-1, keepdims=True))
    nll = -np.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
    return float(np.mean(nll)), (np.exp(logp), targets)


def softmax_cross_entropy_backward(d_loss, cache):
    probs, targets = cache
    grad = probs.copy()
    np.put_along_axis(grad, targets[..., None], np.take_along_axis(grad, targets[..., None], -1) - 1.0, axis=-1)
    return d_loss * grad / targets.shape[-1]  # BUG: the sequence length, not the number of tokens
