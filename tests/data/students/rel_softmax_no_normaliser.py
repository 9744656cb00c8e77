"""A student's softmax backward that keeps the p ∘ dp term and forgets the normaliser's −p ∘ Σ(p ∘ dp)."""

# relation: softmax_backward dx (in softmax_backward) lacks the contribution of the −p ∘ Σ(p ∘ dp) term
import numpy as np


def softmax_forward(x):
    m = np.max(x, axis=-1, keepdims=True)
    e = np.exp(x - np.where(np.isfinite(m), m, 0.0))  # a row of -inf: shift by 0
    total = np.sum(e, axis=-1, keepdims=True)
    p = np.divide(e, total, out=np.zeros_like(e), where=total > 0)  # that row stays 0
    return p, p


def softmax_backward(dp, cache):
    p = cache
    return p * dp  # "the derivative of exp is exp": the row's sum depends on x too
