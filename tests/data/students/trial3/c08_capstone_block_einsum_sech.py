# expect: PASS
"""Correct, unusual style: the block capstone with every linear layer's gradients by einsum, LayerNorm's backward
in its "E · dx̂ − Σ dx̂ − x̂ Σ(dx̂ x̂)" form, GELU's derivative through sech², and the attention's softmax backward
through the Jacobian applied by einsum; F-lines walked strictly from F21 down, every intermediate kept."""

import numpy as np


def _lin(g, name, d_out, inp, W):
    g["W_" + name] = np.einsum("blo,bli->oi", d_out, inp)
    g["b_" + name] = np.einsum("blo->o", d_out)
    return np.einsum("blo,oi->bli", d_out, W)


def _ln(d_xhat, inp, eps):
    E = inp.shape[-1]
    mu = inp.mean(-1, keepdims=True)
    var = ((inp - mu) ** 2).mean(-1, keepdims=True)
    rstd = 1 / np.sqrt(var + eps)
    xhat = (inp - mu) * rstd
    s1 = d_xhat.sum(-1, keepdims=True)
    s2 = (d_xhat * xhat).sum(-1, keepdims=True)
    return rstd / E * (E * d_xhat - s1 - xhat * s2)


def capstone_block_backward(cache):
    c = cache
    B, L, E = c["x"].shape
    H = c["num_heads"]
    D = E // H
    g = {}
    g["y"] = c["d_y"]  # F21
    g["f"] = g["y"].copy()  # F20
    g["gl"] = _lin(g, "2", g["f"], c["gl"], c["W_2"])  # F19
    u = c["u"]  # F18
    k0 = np.sqrt(2 / np.pi)
    inner = k0 * (u + 0.044715 * u**3)
    sech2 = 1 / np.cosh(inner) ** 2
    dgelu = 0.5 * (1 + np.tanh(inner)) + 0.5 * u * sech2 * k0 * (1 + 3 * 0.044715 * u**2)
    g["u"] = g["gl"] * dgelu
    g["n2"] = _lin(g, "1", g["u"], c["n2"], c["W_1"])  # F17
    g["gamma2"] = np.einsum("ble,ble->e", g["n2"], c["xhat2"])  # F16
    g["beta2"] = np.einsum("ble->e", g["n2"])
    g["xhat2"] = g["n2"] * c["gamma2"]
    g["h"] = _ln(g["xhat2"], c["h"], c["eps"]) + g["y"]  # F15 + F20's skip
    g["a"] = g["h"].copy()  # F14
    g["merged"] = _lin(g, "o", g["a"], c["merged"], c["W_o"])  # F13
    g["ctx"] = np.einsum("blhd->bhld", g["merged"].reshape(B, L, H, D))  # F12
    g["weights"] = np.einsum("bhqd,bhkd->bhqk", g["ctx"], c["vh"])  # F11
    g["vh"] = np.einsum("bhqk,bhqd->bhkd", c["weights"], g["ctx"])
    p = c["weights"]  # F10: the Jacobian diag(p) - p pᵀ, row by row
    J = np.einsum("bhqk,kj->bhqkj", p, np.eye(L)) - np.einsum("bhqk,bhqj->bhqkj", p, p)
    g["scores"] = np.einsum("bhqkj,bhqj->bhqk", J, g["weights"])
    g["qh"] = c["scale"] * np.einsum("bhqk,bhkd->bhqd", g["scores"], c["kh"])  # F9
    g["kh"] = c["scale"] * np.einsum("bhqk,bhqd->bhkd", g["scores"], c["qh"])
    for n in ("q", "k", "v"):  # F6-F8
        g[n] = np.einsum("bhld->blhd", g[n + "h"]).reshape(B, L, E)
    g["n1"] = sum(_lin(g, n, g[n], c["n1"], c["W_" + n]) for n in ("q", "k", "v"))  # F3-F5
    g["gamma1"] = np.einsum("ble,ble->e", g["n1"], c["xhat1"])  # F2
    g["beta1"] = np.einsum("ble->e", g["n1"])
    g["xhat1"] = g["n1"] * c["gamma1"]
    g["x"] = _ln(g["xhat1"], c["x"], c["eps"]) + g["h"]  # F1 + F14's skip
    return g
