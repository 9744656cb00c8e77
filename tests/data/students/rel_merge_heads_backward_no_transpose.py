"""A student's merge_heads backward that reshapes back to (B, L, H, d) and forgets the transpose to (B, H, L, d);
the split is right, written with einsum-free swapaxes."""

# relation: merge_heads_backward dx (in merge_heads_backward) has its axes (1, 2) swapped
import numpy as np


def split_heads_forward(x, num_heads):
    B, L, E = x.shape
    return np.swapaxes(x.reshape(B, L, num_heads, E // num_heads), 1, 2), x.shape  # (B, L, H, d) -> (B, H, L, d)


def split_heads_backward(d_out, cache):
    return np.swapaxes(d_out, 1, 2).reshape(cache)  # (B, H, L, d) -> (B, L, H, d) -> (B, L, E)


def merge_heads_forward(x):
    B, H, L, d = x.shape
    return np.swapaxes(x, 1, 2).reshape(B, L, H * d), x.shape  # (B, L, H, d) -> (B, L, E)


def merge_heads_backward(d_out, cache):
    B, H, L, d = cache
    return d_out.reshape(B, L, H, d)  # (B, L, E) -> (B, L, H, d): the transpose back to (B, H, L, d) is missing
