# expect: FAIL
# where: capstone_model_backward F11 scores
# name: relation wrong-axis | catalogue softmax_wrong_axis
"""Outside the catalogue: at F11 the softmax's row term Σ_j p_j dp_j is summed over the queries (axis -2) instead
of the keys; the weights are square (L × L) so no shape complains."""

import numpy as np


def capstone_model_backward(cache):
    c = cache
    B, L = c["tokens"].shape
    H, scale = c["num_heads"], c["scale"]
    E = c["x"].shape[-1]
    N = B * L
    g = {}
    # ← F17: loss = mean(-log softmax(logits)[targets]): d_logits = (probs - onehot) / N
    e = np.exp(c["logits"] - c["logits"].max(axis=-1, keepdims=True))
    probs = e / e.sum(axis=-1, keepdims=True)  # (B, L, V)
    d_logits = probs.copy()
    np.add.at(d_logits, (np.arange(B)[:, None], np.arange(L)[None, :], c["targets"]), -1.0)
    g["logits"] = d_logits / N
    # ← F16: logits = h @ W_out.T + b_out
    g["h"] = g["logits"] @ c["W_out"]  # (B, L, V) @ (V, E) -> (B, L, E)
    g["W_out"] = g["logits"].reshape(N, -1).T @ c["h"].reshape(N, E)  # (V, N) @ (N, E) -> (V, E)
    g["b_out"] = g["logits"].sum(axis=(0, 1))  # (V,)
    # ← F15: h = x + a: both terms get d_h
    g["a"] = g["h"]
    # ← F14: a = merged @ W_o.T + b_o
    g["merged"] = g["a"] @ c["W_o"]  # (B, L, E)
    g["W_o"] = g["a"].reshape(N, E).T @ c["merged"].reshape(N, E)  # (E, E)
    g["b_o"] = g["a"].sum(axis=(0, 1))  # (E,)
    # ← F13: merged = ctx.transpose(0, 2, 1, 3).reshape(B, L, E)
    g["ctx"] = g["merged"].reshape(B, L, H, E // H).transpose(0, 2, 1, 3)  # (B, H, L, D)
    # ← F12: ctx = weights @ vh
    g["weights"] = g["ctx"] @ c["vh"].swapaxes(-1, -2)  # (B, H, L, D) @ (B, H, D, L) -> (B, H, L, L)
    g["vh"] = c["weights"].swapaxes(-1, -2) @ g["ctx"]  # (B, H, L, L) @ (B, H, L, D) -> (B, H, L, D)
    # ← F11: weights = softmax(scores): p * (dp - sum(p * dp))
    p = c["weights"]
    g["scores"] = p * (g["weights"] - (p * g["weights"]).sum(axis=-2, keepdims=True))  # BUG: axis -2
    # ← F10: scores = qh @ kh.T * scale
    g["qh"] = g["scores"] @ c["kh"] * scale  # (B, H, L, L) @ (B, H, L, D) -> (B, H, L, D)
    g["kh"] = g["scores"].swapaxes(-1, -2) @ c["qh"] * scale  # (B, H, L, L) @ (B, H, L, D) -> (B, H, L, D)
    # ← F9, F8, F7: undo the head split: transpose back, then reshape
    g["v"] = g["vh"].transpose(0, 2, 1, 3).reshape(B, L, E)
    g["k"] = g["kh"].transpose(0, 2, 1, 3).reshape(B, L, E)
    g["q"] = g["qh"].transpose(0, 2, 1, 3).reshape(B, L, E)
    # ← F6, F5, F4: the three projections of x
    d_x = g["h"].copy()  # F15's skip path
    for name in ("v", "k", "q"):
        d = g[name]
        d_x += d @ c[f"W_{name}"]  # (B, L, E) @ (E, E)
        g[f"W_{name}"] = d.reshape(N, E).T @ c["x"].reshape(N, E)  # (E, E)
        g[f"b_{name}"] = d.sum(axis=(0, 1))  # (E,)
    g["x"] = d_x  # the four paths into x, summed
    # ← F3: x = tok + pos
    g["tok"], g["pos"] = g["x"], g["x"]
    # ← F2, F1: scatter-add the rows back into the tables (repeats accumulate)
    g["pos_emb"] = np.zeros_like(c["pos_emb"])
    np.add.at(g["pos_emb"], c["positions"], g["pos"])
    g["tok_emb"] = np.zeros_like(c["tok_emb"])
    np.add.at(g["tok_emb"], c["tokens"], g["tok"])
    return g
