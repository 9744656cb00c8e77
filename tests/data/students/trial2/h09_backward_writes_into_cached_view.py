# expect: FAIL
# where: split_heads_backward
# name: hostile | relation mutation
"""Hostile: the forward returns a view of its input and caches the input itself; the backward writes the gradient
into that cached array (saving an allocation) and returns it."""


def split_heads_forward(x, num_heads):
    B, L, E = x.shape
    return x.reshape(B, L, num_heads, E // num_heads).transpose(0, 2, 1, 3), x  # a view, and x itself


def split_heads_backward(d_out, cache):
    x = cache
    x[...] = d_out.transpose(0, 2, 1, 3).reshape(x.shape)  # right values, written into the forward's input
    return x
