# expect: PASS
"""Correct, unusual style: exercise 9's whole backward with einsum, a helper per kind of line, and one-hot
matrices for the embedding tables (repeats add up by the product)."""

import numpy as np


def _linear_back(d, inp, W):
    """out = inp @ W.T + b -> (d_inp, d_W, d_b)."""
    return np.einsum("blo,oi->bli", d, W), np.einsum("blo,bli->oi", d, inp), d.sum(axis=(0, 1))


def _heads(t, H):
    B, L, E = t.shape
    return t.reshape(B, L, H, E // H).transpose(0, 2, 1, 3)  # (B, H, L, D)


def _unheads(t):
    B, H, L, D = t.shape
    return t.transpose(0, 2, 1, 3).reshape(B, L, H * D)  # (B, L, E)


def capstone_model_backward(cache):
    c = cache
    H, scale = c["num_heads"], c["scale"]
    V = c["logits"].shape[-1]
    onehot = np.eye(V)[c["targets"]]  # (B, L, V)
    z = c["logits"] - c["logits"].max(axis=-1, keepdims=True)
    probs = np.exp(z) / np.exp(z).sum(axis=-1, keepdims=True)
    g = {"logits": (probs - onehot) / c["targets"].size}
    g["h"], g["W_out"], g["b_out"] = _linear_back(g["logits"], c["h"], c["W_out"])
    g["a"] = g["h"]
    g["merged"], g["W_o"], g["b_o"] = _linear_back(g["a"], c["merged"], c["W_o"])
    g["ctx"] = _heads(g["merged"], H)
    g["weights"] = np.einsum("bhqd,bhkd->bhqk", g["ctx"], c["vh"])
    g["vh"] = np.einsum("bhqk,bhqd->bhkd", c["weights"], g["ctx"])
    w = c["weights"]
    g["scores"] = w * (g["weights"] - np.einsum("bhqk,bhqk->bhq", w, g["weights"])[..., None])
    g["qh"] = scale * np.einsum("bhqk,bhkd->bhqd", g["scores"], c["kh"])
    g["kh"] = scale * np.einsum("bhqk,bhqd->bhkd", g["scores"], c["qh"])
    d_x = g["h"].copy()
    for n in ("v", "k", "q"):
        g[n] = _unheads(g[n + "h"])
        d_in, g["W_" + n], g["b_" + n] = _linear_back(g[n], c["x"], c["W_" + n])
        d_x = d_x + d_in
    g["x"] = d_x
    g["tok"] = g["pos"] = g["x"]
    tok_hot = np.eye(c["tok_emb"].shape[0])[c["tokens"]]  # (B, L, Vtok)
    pos_hot = np.eye(c["pos_emb"].shape[0])[c["positions"]]  # (B, L, Lmax)
    g["tok_emb"] = np.einsum("blv,ble->ve", tok_hot, g["tok"])
    g["pos_emb"] = np.einsum("blp,ble->pe", pos_hot, g["pos"])
    return g
