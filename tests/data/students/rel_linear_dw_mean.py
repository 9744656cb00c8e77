"""A student's linear backward that averages the weight gradient over the rows (as if the loss were a mean)."""

# relation: linear_backward dW (in linear_backward) is 1/N (the rows, every axis but the last) (= 0.166667) times


def linear_forward(x, W, b):
    return x @ W.T + b, (x, W)  # (..., in) @ (in, out) -> (..., out)


def linear_backward(dy, cache):
    x, W = cache
    rows_x, rows_dy = x.reshape(-1, x.shape[-1]), dy.reshape(-1, dy.shape[-1])  # (N, in), (N, out)
    dW = rows_dy.T @ rows_x / len(rows_x)  # (out, N) @ (N, in): "the mean over the batch"
    return dy @ W, dW, rows_dy.sum(axis=0)  # (..., out) @ (out, in)
