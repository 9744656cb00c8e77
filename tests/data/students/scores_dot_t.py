"""A student's scores pair with `.T` on 4-D arrays, forward and backward."""

# expect: attention_scores_forward scores_dot_t
# expect: attention_scores_backward scores_dot_t


def attention_scores_forward(q, k, scale):
    return q @ k.T * scale, (q, k, scale)


def attention_scores_backward(d_scores, cache):
    q, k, scale = cache
    dq = d_scores @ k * scale
    dk = d_scores.T @ q * scale
    return dq, dk
