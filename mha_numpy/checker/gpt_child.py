"""Exercise 15's GPT in plain NumPy: the training of stage 4, run where the student's functions are.

``capstone_gpt`` builds the GPT from the library's pairs; the checker's child process (``checker.child``) never
imports the library (``checker.guard``), so the training it runs with a student's ``capstone_block_backward`` is
this file, loaded there from its source after ``optim.py`` (whose ``Adam`` and ``clip_grad_norm`` it uses; the
``from ..optim`` line is dropped there), when stage 4 starts: after every verdict on the student's functions, into a
module ``sys.modules`` does not hold. NumPy and the standard library only below it. The model is
``capstone_gpt``'s, G1-G5; ``block_forward`` makes the dict ``capstone_block.block_forward`` makes (the cache the
student's backward reads), and ``loss_and_grads`` the gradients ``capstone_gpt.loss_and_grads`` gives:
tests/test_gpt_stages.py holds them equal. The pairs around the block (G1 embedding, G3 layer_norm, G4 linear,
G5 softmax_cross_entropy) are the student's where the file defines both halves (``pairs``), else the plain ones here.

Sizes travel as a dict (``dataclasses.asdict(capstone_gpt.GPTSizes)``): the child has no class of the library.
"""

from __future__ import annotations

import math
import time

import numpy as np

from ..optim import Adam, clip_grad_norm

EPS = 1e-5
# capstone_block.PARAMS (the child cannot import it)
PARAMS = ("gamma1", "beta1", "W_q", "b_q", "W_k", "b_k", "W_v", "b_v", "W_o", "b_o", "gamma2", "beta2",
          "W_1", "b_1", "W_2", "b_2")  # fmt: skip
GPT_PAIRS = ("embedding", "layer_norm", "linear", "softmax_cross_entropy")  # G1, G3, G4, G5


def _norm(x: np.ndarray) -> np.ndarray:
    """(x - mean) / sqrt(var + eps) over the last axis."""
    xc = x - x.mean(axis=-1, keepdims=True)  # (..., E)
    return xc / np.sqrt((xc * xc).mean(axis=-1, keepdims=True) + EPS)  # (..., E) / (..., 1)


def block_forward(P: dict, x: np.ndarray, num_heads: int) -> dict:
    """Exercise 10's causal pre-norm block (F1-F20) -> every intermediate, parameter and input by name."""
    B, L, E = x.shape
    H, D = num_heads, E // num_heads
    scale = 1.0 / np.sqrt(D)
    v = dict(x=x, num_heads=H, scale=scale, eps=EPS, **P)
    v["xhat1"] = _norm(x)  # F1
    v["n1"] = v["xhat1"] * P["gamma1"] + P["beta1"]  # F2
    for n in ("q", "k", "v"):
        v[n] = v["n1"] @ P[f"W_{n}"].T + P[f"b_{n}"]  # F3-F5: (B, L, E) @ (E, E) -> (B, L, E)
        v[n + "h"] = v[n].reshape(B, L, H, D).transpose(0, 2, 1, 3)  # F6-F8: (B, L, H, D) -> (B, H, L, D)
    scores = v["qh"] @ v["kh"].swapaxes(-1, -2) * scale  # F9: (B, H, L, D) @ (B, H, D, L) -> (B, H, L, L)
    v["scores"] = np.where(np.tri(L, dtype=bool), scores, -1e30)  # causal: key j <= query i
    e = np.exp(v["scores"] - v["scores"].max(axis=-1, keepdims=True))  # (B, H, L, L)
    v["weights"] = e / e.sum(axis=-1, keepdims=True)  # F10
    v["ctx"] = v["weights"] @ v["vh"]  # F11: (B, H, L, L) @ (B, H, L, D) -> (B, H, L, D)
    v["merged"] = v["ctx"].transpose(0, 2, 1, 3).reshape(B, L, E)  # F12: (B, L, H, D) -> (B, L, E)
    v["a"] = v["merged"] @ P["W_o"].T + P["b_o"]  # F13: (B, L, E) @ (E, E)
    v["h"] = x + v["a"]  # F14
    v["xhat2"] = _norm(v["h"])  # F15
    v["n2"] = v["xhat2"] * P["gamma2"] + P["beta2"]  # F16
    v["u"] = v["n2"] @ P["W_1"].T + P["b_1"]  # F17: (B, L, E) @ (E, I) -> (B, L, I)
    u = v["u"]
    v["gl"] = 0.5 * u * (1 + np.tanh(np.sqrt(2 / np.pi) * (u + 0.044715 * u**3)))  # F18
    v["f"] = v["gl"] @ P["W_2"].T + P["b_2"]  # F19: (B, L, I) @ (I, E) -> (B, L, E)
    v["y"] = v["h"] + v["f"]  # F20
    return v


# ---------------------------------------------------------------- the pairs around the block (G1, G3, G4, G5)


def embedding_forward(ids, table):
    return table[ids], (ids, table.shape)  # (..., E)


def embedding_backward(d_out, cache):
    ids, shape = cache
    d_table = np.zeros(shape)
    np.add.at(d_table, ids, d_out)  # repeated ids add up
    return d_table


def layer_norm_forward(x, gamma, beta, eps):
    xhat = _norm(x)  # (..., E)
    return xhat * gamma + beta, (x, xhat, gamma)


def layer_norm_backward(d_out, cache):
    x, xhat, gamma = cache
    d_xhat = d_out * gamma
    rstd = 1.0 / np.sqrt(x.var(axis=-1, keepdims=True) + EPS)  # (..., 1)
    dx = rstd * (d_xhat - d_xhat.mean(axis=-1, keepdims=True) - xhat * (d_xhat * xhat).mean(axis=-1, keepdims=True))
    lead = tuple(range(d_out.ndim - 1))
    return dx, (d_out * xhat).sum(axis=lead), d_out.sum(axis=lead)


def linear_forward(x, W, b):
    return x @ W.T + b, (x, W)  # (..., in) @ (in, out) -> (..., out)


def linear_backward(d_out, cache):
    x, W = cache
    d2, x2 = d_out.reshape(-1, d_out.shape[-1]), x.reshape(-1, x.shape[-1])  # (N, out), (N, in)
    return d_out @ W, d2.T @ x2, d2.sum(axis=0)  # (..., in), (out, in), (out,)


def softmax_cross_entropy_forward(logits, targets):
    shifted = logits - logits.max(axis=-1, keepdims=True)  # (..., V)
    log_p = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    loss = -np.take_along_axis(log_p, targets[..., None], axis=-1).mean()
    return float(loss), (np.exp(log_p), targets)


def softmax_cross_entropy_backward(d_loss, cache):
    p, targets = cache
    d = p.copy()  # (..., V)
    np.put_along_axis(d, targets[..., None], np.take_along_axis(d, targets[..., None], axis=-1) - 1, axis=-1)
    return d * (d_loss / targets.size)


PLAIN = {name: (globals()[f"{name}_forward"], globals()[f"{name}_backward"]) for name in GPT_PAIRS}


def _grads(result, n: int) -> list:
    """A backward's result as its first ``n`` gradients (one array, a tuple, a list: the course's conventions)."""
    return (list(result) if isinstance(result, tuple | list) else [result])[:n]


# ---------------------------------------------------------------- the GPT (G1-G5) and its training


def loss_and_grads(P: dict, ids: np.ndarray, s: dict, block_backward, pairs: dict | None = None):
    """ids (B, L + 1) -> (loss, gradients by name), ``block_backward(cache)`` for each block (the last first) and the
    student's ``pairs`` {name: (forward, backward)} where given, else the plain ones."""
    pair = {**PLAIN, **(pairs or {})}
    x_ids, y_ids = ids[:, :-1], ids[:, 1:]  # (B, L) each
    L = x_ids.shape[1]
    tok, c_tok = pair["embedding"][0](x_ids, P["tok_emb"])  # G1: (B, L, E)
    pos, c_pos = pair["embedding"][0](np.arange(L), P["pos_emb"])  # G1: (L, E)
    x = np.asarray(tok) + np.asarray(pos)  # G1: (B, L, E) + (L, E)
    caches = []
    for i in range(s["layers"]):
        caches.append(block_forward({n: P[f"layers.{i}.{n}"] for n in PARAMS}, x, s["heads"]))  # G2
        x = caches[-1]["y"]
    n, c_n = pair["layer_norm"][0](x, P["gamma_f"], P["beta_f"], EPS)  # G3: (B, L, E)
    no_bias = np.zeros(P["W_head"].shape[0])  # (V,): the head has none; exercise 1's linear_forward needs a b
    logits, c_head = pair["linear"][0](np.asarray(n), P["W_head"], no_bias)  # G4: (B, L, E) @ (E, V) -> (B, L, V)
    loss, c_loss = pair["softmax_cross_entropy"][0](np.asarray(logits), y_ids)  # G5: ()
    g: dict = {}
    (d,) = _grads(pair["softmax_cross_entropy"][1](1.0, c_loss), 1)  # ← G5: (B, L, V)
    d, g["W_head"] = _grads(pair["linear"][1](np.asarray(d), c_head), 2)  # ← G4: (B, L, E)
    d, g["gamma_f"], g["beta_f"] = _grads(pair["layer_norm"][1](np.asarray(d), c_n), 3)  # ← G3
    for i in reversed(range(s["layers"])):  # ← G2: the last block first
        cache = caches[i]
        cache["d_y"] = np.asarray(d)  # the block's "loss" sum(y * d_y) has d loss / d y = d
        got = block_backward(cache)
        g.update({f"layers.{i}.{n}": np.asarray(got[n]) for n in PARAMS})
        d = np.asarray(got["x"])  # (B, L, E)
    (g["tok_emb"],) = _grads(pair["embedding"][1](d, c_tok), 1)  # ← G1: repeated bytes add up
    (g["pos_emb"],) = _grads(pair["embedding"][1](d.sum(axis=0), c_pos), 1)  # ← G1: pos was broadcast over B
    return float(loss), {name: np.asarray(g[name], dtype=np.float64) for name in P}


def windows(ids: np.ndarray, batch: int, length: int, rng: np.random.Generator) -> np.ndarray:
    """(batch, length + 1) windows of ``ids`` at random starts."""
    starts = rng.integers(0, len(ids) - length, size=batch)  # (B,)
    return ids[starts[:, None] + np.arange(length + 1)]  # (B, 1) + (L + 1,) -> (B, L + 1)


def learning_rate(lr: float, step: int, steps: int) -> float:
    """20 steps of warm-up, then a cosine from lr down to lr / 10."""
    return lr * min(1.0, step / 20) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / steps)))


def train(P: dict, train_ids, s: dict, block_backward, pairs=None, *, steps: int, batch: int, lr: float, seed: int,
          log=None) -> tuple[dict, list[float], float]:  # fmt: skip
    """``steps`` clipped Adam steps from the parameters ``P`` (changed in place) on windows of ``train_ids`` ->
    (P, the training losses, the seconds it took). ``log(line)`` every 50 steps."""
    opt, rng, losses, began = Adam(P, lr=lr), np.random.default_rng(seed + 1), [], time.perf_counter()
    for step in range(1, steps + 1):
        opt.lr = learning_rate(lr, step, steps)
        loss, grads = loss_and_grads(P, windows(train_ids, batch, s["context"], rng), s, block_backward, pairs)
        opt.step(clip_grad_norm(grads, 1.0)[0])
        losses.append(loss)
        if log is not None and step % 50 == 0:
            log(f"step {step}  loss {loss:.3f}")
    return P, losses, time.perf_counter() - began
