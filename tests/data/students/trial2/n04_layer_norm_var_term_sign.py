# expect: FAIL
# where: layer_norm_backward x
# name: relation term-sign
"""Near layer_norm_no_var: the variance term is there, with the wrong sign."""


def layer_norm_forward(x, gamma, beta, eps):
    mu = x.mean(-1, keepdims=True)
    rstd = (((x - mu) ** 2).mean(-1, keepdims=True) + eps) ** -0.5
    xhat = (x - mu) * rstd
    return xhat * gamma + beta, (xhat, rstd, gamma)


def layer_norm_backward(d_out, cache):
    xhat, rstd, gamma = cache
    lead = tuple(range(d_out.ndim - 1))
    g = d_out * gamma
    dx = rstd * (g - g.mean(-1, keepdims=True) + xhat * (g * xhat).mean(-1, keepdims=True))  # BUG: + for -
    return dx, (d_out * xhat).sum(axis=lead), d_out.sum(axis=lead)
