"""A student's head split with a loop whose slices start one feature late."""

# expect: split_heads_forward split_heads_off_by_one
import numpy as np


def split_heads_forward(x, num_heads):
    d = x.shape[-1] // num_heads
    heads = []
    for h in range(num_heads):
        heads.append(x[:, :, h * d + 1 : (h + 1) * d + 1])
    return np.stack(heads, axis=1), x.shape
