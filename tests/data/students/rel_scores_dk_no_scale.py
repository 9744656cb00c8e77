"""A student's scores backward that scales dq and forgets the scale on dk only."""

# relation: attention_scores_backward dk (in attention_scores_backward) is 1/scale (= 2) times the right one


def attention_scores_forward(q, k, scale):
    return (q @ k.swapaxes(-1, -2)) * scale, (q, k, scale)


def attention_scores_backward(d_scores, cache):
    q, k, scale = cache
    dq = (d_scores * scale) @ k  # (Lq, Lk) @ (Lk, d)
    dk = d_scores.swapaxes(-1, -2) @ q  # (Lk, Lq) @ (Lq, d): the scale is missing here
    return dq, dk
