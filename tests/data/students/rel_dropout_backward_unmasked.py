"""A student's dropout backward that rescales by 1/(1 − p) and forgets to drop: the dropped entries get a gradient."""

# relation: dropout_backward dx (in dropout_backward) is wrong only on the dropped entries (keep_mask False)


def dropout_forward(x, p, rng, keep_mask):
    return x * keep_mask / (1 - p), (keep_mask, p)


def dropout_backward(d_out, cache):
    keep_mask, p = cache
    return d_out / (1 - p)  # the inverted scale, but every entry passes
