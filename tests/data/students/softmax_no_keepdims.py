"""A student's softmax backward whose row sum loses its axis."""

# expect: softmax_backward softmax_no_keepdims


def softmax_backward(dp, cache):
    p = cache
    row = (p * dp).sum(axis=-1)
    return p * (dp - row)
