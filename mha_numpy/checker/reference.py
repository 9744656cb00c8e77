"""Reference functions the checker needs beyond ``functional`` and ``models.layers``.

- ``self_attention_forward/backward``: self-attention as one pair, on ``MultiHeadAttention`` (the same
  array is query, key and value, so its gradient is the sum of the three paths).
- ``online_softmax_attention``: drives a student's ``online_softmax_update`` over key blocks, as the
  chunked kernel does, so the result can be compared with a direct softmax.
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
