"""A student's linear pair: dW from xᵀ dy (tests/test_checker.py reads the expect line)."""

# expect: linear_backward linear_swapped_dw


def linear_forward(x, W, b):
    return x @ W.T + b, (x, W)


def linear_backward(dy, cache):
    x, W = cache
    x2, dy2 = x.reshape(-1, x.shape[-1]), dy.reshape(-1, dy.shape[-1])
    dx = dy @ W
    dW = x2.T @ dy2
    db = dy2.sum(axis=0)
    return dx, dW, db
