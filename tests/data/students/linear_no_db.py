"""A student's linear pair that forgets the bias gradient."""

# expect: linear_backward linear_no_db


def linear_forward(x, W, b):
    return x @ W.T + b, (x, W)


def linear_backward(dy, cache):
    x, W = cache
    dx = dy @ W
    dW = dy.reshape(-1, dy.shape[-1]).T @ x.reshape(-1, x.shape[-1])
    return dx, dW
