# expect: PASS
"""Correct, unusual style: the softmax as a class of static methods bound to the pair's names (fully masked rows
skipped by boolean indexing), the cross-entropy as a loop over the tokens."""

import numpy as np


class Softmax:
    @staticmethod
    def forward(x):
        out = np.zeros_like(x)
        alive = np.isfinite(x).any(axis=-1)  # rows with at least one key allowed
        rows = x[alive]  # (n, Lk)
        e = np.exp(rows - rows.max(axis=-1, keepdims=True))
        out[alive] = e / e.sum(axis=-1, keepdims=True)
        return out, out

    @staticmethod
    def backward(dp, p):
        dot = np.einsum("...k,...k->...", p, dp)[..., None]  # (..., Lq, 1)
        return p * dp - p * dot


softmax_forward = Softmax.forward
softmax_backward = Softmax.backward


def softmax_cross_entropy_forward(logits, targets):
    flat = logits.reshape(-1, logits.shape[-1])  # (N, V)
    t = targets.reshape(-1)
    probs = np.empty_like(flat)
    losses = []
    for i in range(flat.shape[0]):
        row = flat[i] - flat[i].max()
        lse = np.log(np.exp(row).sum())
        losses.append(lse - row[t[i]])
        probs[i] = np.exp(row - lse)
    return float(np.mean(losses)), (probs.reshape(logits.shape), targets)


def softmax_cross_entropy_backward(d_loss, cache):
    p, targets = cache
    g = p.copy()
    for idx in np.ndindex(targets.shape):
        g[idx + (targets[idx],)] -= 1.0
    return g * (d_loss / targets.size)
