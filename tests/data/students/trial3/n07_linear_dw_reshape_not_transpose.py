# expect: FAIL
# where: linear_backward W
# name: relation transpose
"""Near linear_swapped_dw: xᵀ dy has shape (in, out), and the student makes it fit W with a reshape where a
transpose belongs; the shape is right, the entries are scrambled (for a square W it is the transpose)."""


def linear_forward(x, W, b):
    return x @ W.T + b, (x, W)


def linear_backward(dy, cache):
    x, W = cache
    X = x.reshape(-1, x.shape[-1])  # (N, in)
    G = dy.reshape(-1, dy.shape[-1])  # (N, out)
    dW = (X.T @ G).reshape(W.shape)  # BUG: (in, out) reshaped to (out, in), not transposed
    return dy @ W, dW, G.sum(axis=0)
