"""A student's softmax backward that subtracts the row term and forgets the outer factor p."""

# relation: softmax_backward dx (in softmax_backward) is the right one divided by p (the weights), entry by entry
import numpy as np


def softmax_forward(x):
    e = np.exp(x - np.nan_to_num(x.max(axis=-1, keepdims=True), neginf=0.0))  # a row of -inf: shift by 0
    total = e.sum(axis=-1, keepdims=True)
    p = np.where(total > 0, e / np.where(total > 0, total, 1.0), 0.0)
    return p, p


def softmax_backward(dp, cache):
    p = cache
    return dp - (p * dp).sum(axis=-1, keepdims=True)  # "p ∘ (dp − D)" written without its p
