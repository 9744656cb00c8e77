"""Reference functions the checker needs beyond ``functional`` and ``models.layers``.

- ``self_attention_forward/backward``: self-attention as one pair, on ``MultiHeadAttention`` (the same
  array is query, key and value, so its gradient is the sum of the three paths).
- ``online_softmax_attention``: drives a student's ``online_softmax_update`` over key blocks, as the
  chunked kernel does, so the result can be compared with a direct softmax.
- ``flash_attention_forward/backward``: exercise 13's pair, the chunked kernel's algorithm written plainly
  (one loop over key blocks, whole query rows, the cache a student's backward reads).
"""

from __future__ import annotations

import numpy as np

from .. import functional as F
from ..attention import MultiHeadAttention


def self_attention_forward(x: np.ndarray, params: dict, num_heads: int, mask=None):
    """x: (B, L, E), params: W_q, W_k, W_v, W_o (E, E), b_q ... b_o (E,) -> out (B, L, E), cache."""
    mha = MultiHeadAttention(x.shape[-1], num_heads, dtype=x.dtype, rng=0)
    mha.params.update({name: np.asarray(p) for name, p in params.items()})
    out, cache = mha.forward(x, x, x, mask=mask)
    return out, (mha, cache)


def self_attention_backward(d_out: np.ndarray, cache) -> dict:
    """d_out: (B, L, E) -> dict with "x" (B, L, E) = the sum of the query, key and value paths, and each parameter."""
    mha, mha_cache = cache
    grads = mha.backward(d_out, mha_cache)
    dx = grads.pop("query") + grads.pop("key") + grads.pop("value")  # x is used three times: the paths add up
    return {"x": dx, **grads}


def direct_attention(scores: np.ndarray, v: np.ndarray) -> np.ndarray:
    """softmax(scores) v with the reference pairs: scores (..., Lq, Lk), v (..., Lk, dv) -> (..., Lq, dv)."""
    p, _ = F.softmax_forward(scores)
    return F.attention_context_forward(p, v)[0]


def online_softmax_attention(update, scores: np.ndarray, v: np.ndarray, block: int) -> np.ndarray:
    """softmax(scores) v computed block by block over the keys with ``update(m, l, acc, s_blk, v_blk)``.

    m (..., Lq, 1) running max, l (..., Lq, 1) running sum of exp(s - m), acc (..., Lq, dv) running
    sum of exp(s - m) v. Start: m = -inf, l = 0, acc = 0. End: acc / l, and 0 where l = 0 (a row with
    no key allowed).
    """
    m = np.full(scores.shape[:-1] + (1,), -np.inf)  # (..., Lq, 1)
    l_sum = np.zeros(scores.shape[:-1] + (1,))  # (..., Lq, 1)
    acc = np.zeros(scores.shape[:-1] + v.shape[-1:])  # (..., Lq, dv)
    for j in range(0, scores.shape[-1], block):
        m, l_sum, acc = update(m, l_sum, acc, scores[..., j : j + block], v[..., j : j + block, :])
    return acc / np.where(l_sum > 0, l_sum, 1.0)  # (..., Lq, dv)


# --------------------------------------------------------------------------- exercise 13: the FlashAttention pair


def key_tiles(k, v, mask, shape, block):
    """Per key block j: its slice, K_j (B, H, bk, d), V_j (B, H, bk, dv) and its mask tile (B, H, Lq, bk) or None."""
    full = None if mask is None else np.broadcast_to(mask, shape)  # (B, H, Lq, Lk), a view
    for j in range(0, shape[-1], block):
        cut = slice(j, j + block)
        yield cut, k[..., cut, :], v[..., cut, :], None if full is None else full[..., cut]


def tile_scores(q, k_j, mask_j, scale):
    s = (q * scale) @ k_j.swapaxes(-1, -2)  # (B, H, Lq, d) @ (B, H, d, bk) -> (B, H, Lq, bk)
    return s if mask_j is None else np.where(mask_j, s, -np.inf)  # a blocked key: -inf, weight 0


def flash_attention_forward(q, k, v, mask, block):
    """softmax(q kᵀ/√d, masked) v one key block at a time (exercise 13), keeping per row what the backward needs.

    q: (B, H, Lq, d)   k: (B, H, Lk, d)   v: (B, H, Lk, dv)   mask: None, or bool broadcastable to (B, H, Lq, Lk),
    True = may attend   block: keys per tile
    -> o (B, H, Lq, dv), cache (q, k, v, mask, o, m, inv_l, block) with m (B, H, Lq, 1) the row max of the scores
    (0 for a row with no key allowed) and inv_l (B, H, Lq, 1) = 1/ℓ, ℓ = Σ_j exp(S_j - m) (0 for such a row), so
    that P = exp(S - m) · inv_l is the softmax, recomputed tile by tile.
    """
    scale = 1.0 / np.sqrt(q.shape[-1])
    shape = (*q.shape[:-1], k.shape[-2])  # (B, H, Lq, Lk)
    m = np.full((*q.shape[:-1], 1), -np.inf)  # (B, H, Lq, 1) running max
    l_sum = np.zeros_like(m)  # (B, H, Lq, 1) running Σ exp(S - m)
    acc = np.zeros((*q.shape[:-1], v.shape[-1]))  # (B, H, Lq, dv) running Σ exp(S - m) V
    for _, k_j, v_j, mask_j in key_tiles(k, v, mask, shape, block):
        s = tile_scores(q, k_j, mask_j, scale)  # F1: (B, H, Lq, bk)
        m_new = np.maximum(m, s.max(axis=-1, keepdims=True))  # F2: (B, H, Lq, 1)
        shift = np.where(np.isfinite(m_new), m_new, 0.0)  # a row that has seen only -inf: any finite shift
        alpha = np.exp(m - shift)  # F2: rescales the old sums; exp(-inf) = 0 at the start
        e = np.exp(s - shift)  # F3: (B, H, Lq, bk)
        l_sum = alpha * l_sum + e.sum(axis=-1, keepdims=True)  # F3
        acc = alpha * acc + e @ v_j  # F3: (B, H, Lq, bk) @ (B, H, bk, dv) -> (B, H, Lq, dv)
        m = m_new
    inv_l = np.where(l_sum > 0, 1.0 / np.where(l_sum > 0, l_sum, 1.0), 0.0)  # F4: 0 for a row with no key
    o = acc * inv_l  # F4: (B, H, Lq, dv)
    m = np.where(np.isfinite(m), m, 0.0)  # (B, H, Lq, 1), the shift the tiles are recomputed with
    return o, (q, k, v, mask, o, m, inv_l, block)


def flash_attention_backward(d_o, cache):
    """d_o: (B, H, Lq, dv) -> dq (B, H, Lq, d), dk (B, H, Lk, d), dv (B, H, Lk, dv), one key block at a time.

    D = rowsum(dO ∘ O) once; then per tile P = exp(S - m) · inv_l (never stored), dV_j = Pᵀ dO, dP = dO V_jᵀ,
    dS = P ∘ (dP - D), dQ += dS K_j · scale, dK_j = dSᵀ Q · scale (mha_numpy/kernels/chunked.py, its header).
    """
    q, k, v, mask, o, m, inv_l, block = cache
    scale = 1.0 / np.sqrt(q.shape[-1])
    shape = (*q.shape[:-1], k.shape[-2])
    D = (d_o * o).sum(axis=-1, keepdims=True)  # ← F4: (B, H, Lq, 1) = Σ_j P_j dP_j of the whole row
    dq, dk, dv = np.zeros_like(q, dtype=np.float64), np.zeros(k.shape), np.zeros(v.shape)
    for cut, k_j, v_j, mask_j in key_tiles(k, v, mask, shape, block):
        p = np.exp(tile_scores(q, k_j, mask_j, scale) - m) * inv_l  # ← F1-F3 recomputed: (B, H, Lq, bk)
        dv[..., cut, :] = p.swapaxes(-1, -2) @ d_o  # ← F3: (B, H, bk, Lq) @ (B, H, Lq, dv) -> (B, H, bk, dv)
        dp = d_o @ v_j.swapaxes(-1, -2)  # ← F3: (B, H, Lq, dv) @ (B, H, dv, bk) -> (B, H, Lq, bk)
        ds = p * (dp - D)  # ← F2, F3: the softmax VJP, its row term D taken once for the whole row
        dq += ds @ k_j * scale  # ← F1: (B, H, Lq, bk) @ (B, H, bk, d) -> (B, H, Lq, d)
        dk[..., cut, :] = ds.swapaxes(-1, -2) @ q * scale  # ← F1: (B, H, bk, Lq) @ (B, H, Lq, d) -> (B, H, bk, d)
    return dq, dk, dv
