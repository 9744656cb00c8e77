# expect: PASS
"""Correct, unusual style: exercise 10's block backward with the LayerNorm's backward as sums over E (not means),
the GELU's derivative through sech², and the gradients kept in a small dict-of-steps walked from F21 down."""

import numpy as np


def _ln_back(d_xhat, inp, eps):
    E = inp.shape[-1]
    c = inp - inp.mean(axis=-1, keepdims=True)
    sigma = np.sqrt((c * c).mean(axis=-1, keepdims=True) + eps)
    xhat = c / sigma
    s1 = d_xhat.sum(axis=-1, keepdims=True)
    s2 = (d_xhat * xhat).sum(axis=-1, keepdims=True)
    return (E * d_xhat - s1 - xhat * s2) / (E * sigma)


def _gelu_back(d, u):
    a = np.sqrt(2.0 / np.pi)
    inner = a * (u + 0.044715 * u**3)
    sech2 = 1.0 / np.cosh(inner) ** 2
    return d * (0.5 * (1.0 + np.tanh(inner)) + 0.5 * u * sech2 * a * (1.0 + 3 * 0.044715 * u**2))


def capstone_block_backward(cache):
    c = cache
    B, L, E = c["x"].shape
    H, eps, scale = c["num_heads"], c["eps"], c["scale"]
    g = {}

    def lin(name, d_out, inp):
        g["W_" + name] = np.einsum("blo,bli->oi", d_out, inp)
        g["b_" + name] = np.einsum("blo->o", d_out)
        return np.einsum("blo,oi->bli", d_out, c["W_" + name])

    g["y"] = c["d_y"]
    g["f"] = g["y"]
    g["gl"] = lin("2", g["f"], c["gl"])
    g["u"] = _gelu_back(g["gl"], c["u"])
    g["n2"] = lin("1", g["u"], c["n2"])
    g["gamma2"] = np.einsum("ble,ble->e", g["n2"], c["xhat2"])
    g["beta2"] = np.einsum("ble->e", g["n2"])
    g["xhat2"] = g["n2"] * c["gamma2"]
    g["h"] = g["y"] + _ln_back(g["xhat2"], c["h"], eps)
    g["a"] = g["h"]
    g["merged"] = lin("o", g["a"], c["merged"])
    g["ctx"] = np.einsum("blhd->bhld", g["merged"].reshape(B, L, H, E // H))
    g["weights"] = np.einsum("bhqd,bhkd->bhqk", g["ctx"], c["vh"])
    g["vh"] = np.einsum("bhqk,bhqd->bhkd", c["weights"], g["ctx"])
    w = c["weights"]
    g["scores"] = w * (g["weights"] - np.einsum("bhqk,bhqk->bhq", w, g["weights"])[..., None])
    g["qh"] = scale * np.einsum("bhqk,bhkd->bhqd", g["scores"], c["kh"])
    g["kh"] = scale * np.einsum("bhqk,bhqd->bhkd", g["scores"], c["qh"])
    g["n1"] = 0
    for n in "vkq":
        g[n] = np.einsum("bhld->blhd", g[n + "h"]).reshape(B, L, E)
        g["n1"] = g["n1"] + lin(n, g[n], c["n1"])
    g["gamma1"] = np.einsum("ble,ble->e", g["n1"], c["xhat1"])
    g["beta1"] = np.einsum("ble->e", g["n1"])
    g["xhat1"] = g["n1"] * c["gamma1"]
    g["x"] = g["h"] + _ln_back(g["xhat1"], c["x"], eps)
    return g
