"""Solutions to exercises/ex03_scores.ipynb."""


def attention_scores_forward(q, k, scale):
    S = (q @ k.swapaxes(-1, -2)) * scale  # (B, H, Lq, d) @ (B, H, d, Lk) -> (B, H, Lq, Lk)
    return S, (q, k, scale)


def attention_scores_backward(d_scores, cache):
    q, k, scale = cache
    dS = d_scores * scale  # the scale first
    dq = dS @ k  # (Lq, Lk) @ (Lk, d) -> (Lq, d)
    dk = dS.swapaxes(-1, -2) @ q  # (Lk, Lq) @ (Lq, d) -> (Lk, d)
    return dq, dk


def attention_context_forward(p, v):
    return p @ v, (p, v)  # (B, H, Lq, Lk) @ (B, H, Lk, dv) -> (B, H, Lq, dv)


def attention_context_backward(d_context, cache):
    p, v = cache
    dp = d_context @ v.swapaxes(-1, -2)  # (Lq, dv) @ (dv, Lk) -> (Lq, Lk)
    dv = p.swapaxes(-1, -2) @ d_context  # (Lk, Lq) @ (Lq, dv) -> (Lk, dv)
    return dp, dv
