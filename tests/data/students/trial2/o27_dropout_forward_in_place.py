# expect: FAIL
# where: dropout_forward
# name: relation mutation
"""Outside the catalogue: the forward scales its input in place (x *= ...) and returns it; the values are right."""


def dropout_forward(x, p, rng, keep_mask):
    x *= keep_mask / (1.0 - p)  # BUG: writes into the caller's x
    return x, (keep_mask, 1.0 - p)


def dropout_backward(d_out, cache):
    keep_mask, keep = cache
    return d_out * keep_mask / keep
