# expect: FAIL
# where: linear_backward b
# name: relation sum-missing
"""Near bias_batch_only: the bias gradient summed over axes 0 and 1 (right for a 3-D x, not for a 4-D one)."""


def linear_forward(x, W, b):
    return x @ W.T + b, (x, W)


def linear_backward(dy, cache):
    x, W = cache
    dx = dy @ W
    dW = dy.reshape(-1, dy.shape[-1]).T @ x.reshape(-1, x.shape[-1])  # (out, N) @ (N, in)
    db = dy.sum(axis=(0, 1))  # BUG: every leading axis, not just two
    return dx, dW, db
