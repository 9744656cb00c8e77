"""A student's linear forward that adds the bias once in the product (an appended column of ones) and once more."""

# relation: linear_forward out (of linear_forward) has the contribution of the bias b the batch size or 2 (= 2) times
import numpy as np


def linear_forward(x, W, b):
    ones = np.ones(x.shape[:-1] + (1,))
    Wb = np.concatenate([W, b[:, None]], axis=1)  # (out, in + 1): the bias as a last column
    y = np.concatenate([x, ones], axis=-1) @ Wb.T + b  # (..., in + 1) @ (in + 1, out), and b again
    return y, (x, W)  # the backward is not written yet
