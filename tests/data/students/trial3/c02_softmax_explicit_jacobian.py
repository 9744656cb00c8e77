# expect: PASS
"""Correct, unusual style: softmax through log-sum-exp, its backward by building the full Jacobian
diag(p) - p pᵀ per row and applying it with einsum; cross-entropy by a one-hot matrix from np.eye."""

import numpy as np


def softmax_forward(x):
    m = np.max(x, axis=-1, keepdims=True)
    m = np.where(np.isneginf(m), 0.0, m)
    with np.errstate(divide="ignore"):
        lse = m + np.log(np.sum(np.exp(x - m), axis=-1, keepdims=True))  # -inf for a fully masked row
    p = np.where(np.isneginf(lse), 0.0, np.exp(x - np.where(np.isneginf(lse), 0.0, lse)))
    return p, p


def softmax_backward(dp, cache):
    p = cache
    n = p.shape[-1]
    J = p[..., :, None] * np.eye(n) - p[..., :, None] * p[..., None, :]  # (..., n, n), symmetric
    return np.einsum("...ij,...j->...i", J, dp)


def softmax_cross_entropy_forward(logits, targets):
    V = logits.shape[-1]
    onehot = np.eye(V)[targets]  # (..., V)
    z = logits - logits.max(axis=-1, keepdims=True)
    log_p = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
    loss = -(onehot * log_p).sum() / targets.size
    return loss, (np.exp(log_p), onehot)


def softmax_cross_entropy_backward(d_loss, cache):
    p, onehot = cache
    N = p.size // p.shape[-1]
    return d_loss * (p - onehot) / N
