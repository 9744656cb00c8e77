# expect: FAIL
# where: capstone_block_backward F15 h
# name: relation path
"""Near the residual's missing path: at F15 the gradient of h is taken through LayerNorm 2 only, forgetting that
h also reaches y directly through the second residual (F20)."""

import numpy as np


def capstone_block_backward(cache):
    c = cache
    B, L, E = c["x"].shape
    H, scale, eps = c["num_heads"], c["scale"], c["eps"]
    N = B * L
    g = {}

    def linear(d_out, inp, W, name):
        """← out = inp @ W.T + b: fills g["W_" + name], g["b_" + name]; returns d_inp."""
        g["W_" + name] = d_out.reshape(N, -1).T @ inp.reshape(N, -1)  # (out, N) @ (N, in) -> (out, in)
        g["b_" + name] = d_out.sum(axis=(0, 1))  # (out,)
        return d_out @ W  # (B, L, out) @ (out, in) -> (B, L, in)

    def norm(d_xhat, inp):
        """← xhat = (inp - mean) / sqrt(var + eps): the two mean terms."""
        xhat = (inp - inp.mean(axis=-1, keepdims=True)) / np.sqrt(inp.var(axis=-1, keepdims=True) + eps)
        rstd = 1.0 / np.sqrt(inp.var(axis=-1, keepdims=True) + eps)  # (B, L, 1)
        mean_d = d_xhat.mean(axis=-1, keepdims=True)
        mean_dx = (d_xhat * xhat).mean(axis=-1, keepdims=True)
        return rstd * (d_xhat - mean_d - xhat * mean_dx)

    g["y"] = c["d_y"]  # ← F21: loss = sum(y * d_y)
    g["f"] = g["y"]  # ← F20: y = h + f (h's skip part is added at F15)
    g["gl"] = linear(g["f"], c["gl"], c["W_2"], "2")  # ← F19
    u = c["u"]  # ← F18: gl = u * cdf(u), cdf = 0.5 (1 + tanh(s (u + 0.044715 u^3)))
    s = np.sqrt(2 / np.pi)
    t = np.tanh(s * (u + 0.044715 * u**3))
    d_cdf = 0.5 * (1 - t**2) * s * (1 + 3 * 0.044715 * u**2)
    g["u"] = g["gl"] * (0.5 * (1 + t) + u * d_cdf)
    g["n2"] = linear(g["u"], c["n2"], c["W_1"], "1")  # ← F17
    g["gamma2"] = (g["n2"] * c["xhat2"]).sum(axis=(0, 1))  # ← F16
    g["beta2"] = g["n2"].sum(axis=(0, 1))
    g["xhat2"] = g["n2"] * c["gamma2"]
    g["h"] = norm(g["xhat2"], c["h"])  # BUG: the skip of F20 forgotten  # ← F15: the skip of F20 plus the norm's path
    g["a"] = g["h"]  # ← F14: h = x + a
    # ← F13 ... F3: the attention of exercise 9, on n1
    g["merged"] = linear(g["a"], c["merged"], c["W_o"], "o")
    g["ctx"] = g["merged"].reshape(B, L, H, E // H).transpose(0, 2, 1, 3)  # (B, H, L, D)
    g["weights"] = g["ctx"] @ c["vh"].swapaxes(-1, -2)  # (B, H, L, L)
    g["vh"] = c["weights"].swapaxes(-1, -2) @ g["ctx"]  # (B, H, L, D)
    p = c["weights"]
    g["scores"] = p * (g["weights"] - (p * g["weights"]).sum(axis=-1, keepdims=True))
    g["qh"] = g["scores"] @ c["kh"] * scale
    g["kh"] = g["scores"].swapaxes(-1, -2) @ c["qh"] * scale
    d_n1 = np.zeros_like(c["n1"])
    for name in ("v", "k", "q"):
        g[name] = g[name + "h"].transpose(0, 2, 1, 3).reshape(B, L, E)
        d_n1 += linear(g[name], c["n1"], c[f"W_{name}"], name)
    g["n1"] = d_n1  # the three paths q, k, v
    g["gamma1"] = (g["n1"] * c["xhat1"]).sum(axis=(0, 1))  # ← F2
    g["beta1"] = g["n1"].sum(axis=(0, 1))
    g["xhat1"] = g["n1"] * c["gamma1"]
    g["x"] = g["h"] + norm(g["xhat1"], c["x"])  # ← F1: the skip of F14 plus the norm's path
    return g
