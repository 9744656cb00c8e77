"""A student's dropout forward that is not inverted (no 1/(1-p))."""

# expect: dropout_forward dropout_not_inverted


def dropout_forward(x, p, rng, keep_mask):
    return x * keep_mask, keep_mask
