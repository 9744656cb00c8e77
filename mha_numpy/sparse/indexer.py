"""The lightning indexer of DeepSeek Sparse Attention (DeepSeek-V3.2): a few small heads score every key for each
query, and the top k keys are the ones the main attention (MLA) reads.

    Q = rope_half(split(q_resid W_iqᵀ))     (B, nI, Lq, dI)   q_resid = rms_norm(x W_qaᵀ + b_qa), MLA's query latent
    K = rope_half(layer_norm(x W_ikᵀ))      (B, Lk, dI)       one key head, shared by the indexer's heads
    w = x W_iwᵀ · nI^(-1/2)                 (B, Lq, nI)       a weight per query and head
    I_ts = Σ_h w_th · relu(Q_ht · K_s · dI^(-1/2))            (B, Lq, Lk)

nI = index_n_heads, dI = index_head_dim, dr = qk_rope_head_dim. RoPE turns the first dr features of every indexer
head and key, **half-split** (pairs (i, i + dr/2), ``functional.partial_rope`` with rotary_dim = dr, the angles of
MLA's rope part), while MLA's own rope part is interleaved (pairs (0, 1), (2, 3), ...): Hugging Face's
``DeepseekV32Indexer`` says "the indexer uses NON-interleaved (half-split) RoPE". The rope part comes first in an
indexer head ([rope | pass]), last in an MLA head ([nope | rope]). Both scales are the reference's: the dot products
by dI^(-1/2) (``softmax_scale``), the weights by nI^(-1/2). The reference's Hadamard rotation of q and k and its FP8
scoring are left out, as transformers leaves them out: the rotation is orthogonal (q·k unchanged), FP8 a precision.

Parameters (Hugging Face's names in ``interop.deepseek_v32``): W_iq (nI·dI, rq) ``wq_b``, W_ik (dI, E) ``wk``,
ik_norm, ik_norm_b (dI,) ``k_norm`` (a LayerNorm with bias, eps 1e-6), W_iw (nI, E) ``weights_proj``.

Pairs: ``indexer_keys`` (x -> K), ``indexer_queries`` (x, q_resid -> Q, w), ``indexer_scores`` (Q, w, K -> I),
``indexer_selected_scores`` (Q, w, K, index -> I at the selected keys only), and ``indexer`` (their composition,
with every gradient: the indexer's parameters, x and q_resid). The scores are (B, Lq, Lk), as the dense warm-up
needs them: ``indexer_topk`` selects block by block instead, O(block · Lk) at a time, and the sparse stage's loss
scores the selected keys only (``indexer_forward(.., index=)``: (B, Lq, k), O(L · k), nothing Lq × Lk). DSA keeps
no gradient through the selection (an argmax); the indexer learns from its own loss (``indexer_loss``), its inputs
detached.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .. import functional as F
from .._checks import as_float_array, as_int, as_number
from ..models.layers import layer_norm_backward, layer_norm_forward
from .sparse_attention import BLOCK_ENTRIES, scatter_keys
from .topk import QUERY_BLOCK, check_index, check_selection_mask, mask_rows, topk_select


@dataclass(frozen=True)
class IndexerConfig:
    """The indexer's sizes: num_heads nI, head_dim dI, rope_dim dr (even, <= dI), rope_theta, the key norm's eps."""

    num_heads: int
    head_dim: int
    rope_dim: int
    rope_theta: float = 10000.0
    eps: float = 1e-6

    def __post_init__(self):
        as_int(self.num_heads, "index_n_heads", minimum=1)
        as_int(self.head_dim, "index_head_dim", minimum=1)
        r = as_int(self.rope_dim, "qk_rope_head_dim", minimum=2)
        if r % 2 or r > self.head_dim:
            raise ValueError(f"qk_rope_head_dim={r} must be even and at most index_head_dim={self.head_dim}")
        as_number(self.rope_theta, "rope_theta", positive=True)
        as_number(self.eps, "eps", positive=True)

    def param_shapes(self, embed_dim: int, q_lora_rank: int) -> dict[str, tuple[int, ...]]:
        """{name: shape} of the indexer's parameters for model width E and query latent rq."""
        nI, dI = self.num_heads, self.head_dim
        return {"W_iq": (nI * dI, q_lora_rank), "W_ik": (dI, embed_dim), "ik_norm": (dI,), "ik_norm_b": (dI,),
                "W_iw": (nI, embed_dim)}  # fmt: skip

    def init_params(self, embed_dim: int, q_lora_rank: int, rng=None, dtype=np.float64) -> dict[str, np.ndarray]:
        """torch's defaults: linear weights U(±1/√fan_in), the norm's weight 1 and bias 0."""
        rng = np.random.default_rng(rng)
        out = {}
        for name, shape in self.param_shapes(embed_dim, q_lora_rank).items():
            if len(shape) == 2:
                bound = 1.0 / math.sqrt(shape[1])
                out[name] = rng.uniform(-bound, bound, size=shape).astype(dtype)
            else:
                out[name] = (np.ones if name == "ik_norm" else np.zeros)(shape, dtype=dtype)
        return out

    def check_params(self, params: dict, embed_dim: int, q_lora_rank: int, dtype) -> None:
        """ValueError naming the parameter whose shape or dtype is not this indexer's (an indexer of the wrong
        width), before any arithmetic."""
        for name, shape in self.param_shapes(embed_dim, q_lora_rank).items():
            if name not in params:
                raise ValueError(f"indexer params: {name} {shape} is missing (got {sorted(params)})")
            p = as_float_array(params[name], name)
            if p.shape != shape or p.dtype != dtype:
                raise ValueError(f"indexer param {name} has shape {p.shape} and dtype {p.dtype}, expected {shape} "
                                 f"{np.dtype(dtype)} (index_n_heads={self.num_heads}, index_head_dim={self.head_dim},"
                                 f" E={embed_dim}, q_lora_rank={q_lora_rank})")  # fmt: skip


def _check_inputs(c: IndexerConfig, params, x, q_resid=None, positions=None):
    """x (B, L, E), q_resid (B, L, rq) and positions against the parameters: ValueError naming the argument."""
    x = as_float_array(x, "x", ndim=3)
    if positions is not None:
        F.check_positions(positions, *x.shape[:2])
    rq = np.shape(params.get("W_iq", ()))[-1] if np.ndim(params.get("W_iq", ())) == 2 else 1  # W_iq (nI·dI, rq)
    if q_resid is not None:
        q_resid = as_float_array(q_resid, "q_resid", ndim=3)
        if q_resid.shape != (*x.shape[:2], rq) or q_resid.dtype != x.dtype:
            raise ValueError(f"q_resid {q_resid.shape} {q_resid.dtype} must be (B, L, rq) = {(*x.shape[:2], rq)} "
                             f"{x.dtype}: x's tokens, W_iq's columns")  # fmt: skip
    c.check_params(params, x.shape[2], rq, x.dtype)
    return x, q_resid


# --------------------------------------------------------------------------- keys


def indexer_keys_forward(x, params, c: IndexerConfig, positions=None, check=True):
    """x (B, Lk, E) -> K (B, Lk, dI), cache: layer_norm(x W_ikᵀ) with its first dr features turned (half-split)."""
    if check:
        x, _ = _check_inputs(c, params, x, None, positions)
    kl, s1 = F.linear_forward(x, params["W_ik"], None, check=False)  # F1: (B, Lk, dI)
    kn, s2 = layer_norm_forward(kl, params["ik_norm"], params["ik_norm_b"], c.eps)  # F2: (B, Lk, dI)
    K, s3 = F.partial_rope_forward(kn[:, None], positions, c.rope_theta, c.rope_dim, check=check)  # F3: (B, 1, Lk, dI)
    return K[:, 0], (s1, s2, s3)  # (B, Lk, dI)


def indexer_keys_backward(dK, cache):
    """dK (B, Lk, dI) -> dx (B, Lk, E), {W_ik, ik_norm, ik_norm_b}."""
    s1, s2, s3 = cache
    d_kn = F.partial_rope_backward(dK[:, None], s3)[:, 0]  # ← F3: (B, Lk, dI)
    d_kl, d_gamma, d_beta = layer_norm_backward(d_kn, s2)  # ← F2
    dx, dW, _ = F.linear_backward(d_kl, s1)  # ← F1: (B, Lk, E), (dI, E)
    return dx, {"W_ik": dW, "ik_norm": d_gamma, "ik_norm_b": d_beta}


# --------------------------------------------------------------------------- queries and their weights


def indexer_queries_forward(x, q_resid, params, c: IndexerConfig, positions=None, check=True):
    """x (B, Lq, E), q_resid (B, Lq, rq) -> (Q (B, nI, Lq, dI), w (B, Lq, nI)), cache."""
    if check:
        x, q_resid = _check_inputs(c, params, x, q_resid, positions)
    q, s1 = F.linear_forward(q_resid, params["W_iq"], None, check=False)  # F1: (B, Lq, nI·dI)
    Q, s2 = F.split_heads_forward(q, c.num_heads, check=False)  # F2: (B, nI, Lq, dI)
    Q, s3 = F.partial_rope_forward(Q, positions, c.rope_theta, c.rope_dim, check=check)  # F3: [rope | pass]
    w, s4 = F.linear_forward(x, params["W_iw"], None, check=False)  # F4: (B, Lq, nI)
    return (Q, w * c.num_heads**-0.5), (s1, s2, s3, s4, c.num_heads**-0.5)  # F5: w · nI^(-1/2)


def indexer_queries_backward(dQ, dw, cache):
    """dQ (B, nI, Lq, dI), dw (B, Lq, nI) -> dx (B, Lq, E), dq_resid (B, Lq, rq), {W_iq, W_iw}."""
    s1, s2, s3, s4, w_scale = cache
    dx, dW_iw, _ = F.linear_backward(dw * w_scale, s4)  # ← F5, F4: (B, Lq, E)
    dQ = F.partial_rope_backward(dQ, s3)  # ← F3
    dq = F.split_heads_backward(dQ, s2)  # ← F2: (B, Lq, nI·dI)
    dq_resid, dW_iq, _ = F.linear_backward(dq, s1)  # ← F1: (B, Lq, rq)
    return dx, dq_resid, {"W_iq": dW_iq, "W_iw": dW_iw}


# --------------------------------------------------------------------------- scores


def indexer_scores_forward(Q, w, K):
    """Q (B, nI, Lq, dI), w (B, Lq, nI), K (B, Lk, dI) -> I (B, Lq, Lk) = Σ_h w_th relu(Q_ht · K_s / √dI), cache."""
    scale = Q.shape[-1] ** -0.5
    D = Q @ K[:, None].swapaxes(-1, -2) * scale  # F1: (B, nI, Lq, dI) @ (B, 1, dI, Lk) -> (B, nI, Lq, Lk)
    R = np.maximum(D, 0.0)  # F2: relu
    Rt = R.transpose(0, 2, 1, 3)  # (B, Lq, nI, Lk)
    scores = (w[:, :, None, :] @ Rt)[:, :, 0]  # F3: (B, Lq, 1, nI) @ (B, Lq, nI, Lk) -> (B, Lq, Lk)
    return scores, (Q, w, K, D, Rt, scale)


def indexer_scores_backward(dI, cache):
    """dI (B, Lq, Lk) -> dQ (B, nI, Lq, dI), dw (B, Lq, nI), dK (B, Lk, dI). relu'(0) = 0, as torch's."""
    Q, w, K, D, Rt, scale = cache
    dw = (Rt @ dI[..., None])[..., 0]  # ← F3: (B, Lq, nI, Lk) @ (B, Lq, Lk, 1) -> (B, Lq, nI)
    dR = w.transpose(0, 2, 1)[..., None] * dI[:, None]  # ← F3: (B, nI, Lq, 1) · (B, 1, Lq, Lk) -> (B, nI, Lq, Lk)
    dD = dR * (D > 0)  # ← F2
    dQ = dD @ K[:, None] * scale  # ← F1: (B, nI, Lq, Lk) @ (B, 1, Lk, dI) -> (B, nI, Lq, dI)
    dK = (dD.swapaxes(-1, -2) @ Q).sum(axis=1) * scale  # ← F1: (B, nI, Lk, Lq) @ (B, nI, Lq, dI), Σ over heads
    return dQ, dw, dK


# --------------------------------------------------------------------------- the selected keys' scores only


def selected_block_size(B: int, nI: int, dI: int, k: int) -> int:
    """Queries a block of ``indexer_selected_scores``: its gathered keys (k · dI a query) and its per-head products,
    relus and their gradients (~3 · nI · k) under ``sparse_attention.BLOCK_ENTRIES``; at most 256."""
    return max(1, min(256, BLOCK_ENTRIES // max(1, B * k * (dI + 3 * nI))))


def _selected_block(Q, w, K, index, i0, i1):
    """Queries i0 ... i1 - 1 -> their queries Qt (B, n, nI, dI), gathered keys Kg (B, n, k, dI), D (B, n, nI, k)
    the scaled dot products, I (B, n, k) (0 at the -1 slots)."""
    idx = index[:, i0:i1]  # (B, n, k), -1: no key (read as key 0, zeroed below)
    Kg = K[np.arange(K.shape[0])[:, None, None], np.maximum(idx, 0)]  # (B, Lk, dI)[b, idx] -> (B, n, k, dI)
    Qt = Q[:, :, i0:i1].transpose(0, 2, 1, 3)  # (B, nI, n, dI) -> (B, n, nI, dI)
    D = Qt @ Kg.swapaxes(-1, -2) * Q.shape[-1] ** -0.5  # F1: (B, n, nI, dI) @ (B, n, dI, k) -> (B, n, nI, k)
    R = np.maximum(D, 0.0)  # F2: relu
    scores = (w[:, i0:i1, None, :] @ R)[:, :, 0]  # F3: (B, n, 1, nI) @ (B, n, nI, k) -> (B, n, k)
    return Qt, Kg, D, np.where(idx >= 0, scores, 0.0)  # F4: the -1 slots score 0 (the loss masks them)


def indexer_selected_scores_forward(Q, w, K, index, block_size: int | None = None):
    """Q (B, nI, Lq, dI), w (B, Lq, nI), K (B, Lk, dI), index (B, Lq, k) (-1: no key) -> I (B, Lq, k): the scores of
    the selected keys, slot by slot (0 at a -1 slot), cache. Block of queries by block: O(block · nI · k) at a time,
    O(Lq · k) kept (the index and the scores); the backward recomputes each block's products."""
    B, nI, Lq, dI = Q.shape
    n = selected_block_size(B, nI, dI, index.shape[2]) if block_size is None else block_size
    scores = np.empty(index.shape, dtype=Q.dtype)  # (B, Lq, k)
    for i0 in range(0, Lq, n):
        scores[:, i0 : i0 + n] = _selected_block(Q, w, K, index, i0, min(i0 + n, Lq))[3]  # F1-F4
    return scores, (Q, w, K, index, n)


def indexer_selected_scores_backward(dI, cache):
    """dI (B, Lq, k) -> dQ (B, nI, Lq, dI), dw (B, Lq, nI), dK (B, Lk, dI): each selected key's terms summed into
    its row (``sparse_attention.scatter_keys``: a key chosen by many queries sums them all), an unchosen key's 0."""
    Q, w, K, index, n = cache
    B, _, Lq, _ = Q.shape
    scale = Q.shape[-1] ** -0.5
    dQ, dw, dK = np.empty_like(Q), np.empty_like(w), np.zeros_like(K)
    for i0 in range(0, Lq, n):
        i1 = min(i0 + n, Lq)
        Qt, Kg, D, _ = _selected_block(Q, w, K, index, i0, i1)  # F1-F4 recomputed
        dI_b = np.where(index[:, i0:i1] >= 0, dI[:, i0:i1], 0.0)[:, :, None, :]  # ← F4: (B, n, 1, k)
        dw[:, i0:i1] = (np.maximum(D, 0.0) @ dI_b.swapaxes(-1, -2))[..., 0]  # ← F3: (B, n, nI, k) @ (B, n, k, 1)
        dD = w[:, i0:i1, :, None] * dI_b * (D > 0)  # ← F3, F2: (B, n, nI, 1) · (B, n, 1, k) -> (B, n, nI, k)
        dQ[:, :, i0:i1] = (dD @ Kg * scale).transpose(0, 2, 1, 3)  # ← F1: (B, n, nI, k) @ (B, n, k, dI)
        for b in range(B):  # ← F1: dK_j = Σ_{i, s: index[i, s] = j} Σ_h dD_his q_hi · scale
            scatter_keys(dK[b][None], index[b, i0:i1], (dD[b] * scale)[None], Qt[b][None])  # (1, Lk, dI) in place
    return dQ, dw, dK


# --------------------------------------------------------------------------- the composition


def indexer_forward(x, q_resid, params, c: IndexerConfig, positions=None, index=None, block_size: int | None = None):
    """Self-attention's indexer scores: x (B, L, E), q_resid (B, L, rq) -> I (B, L, L) (no mask: ``topk_select``
    and ``indexer_loss`` take it), cache. positions: None (0 ... L-1), (L,) or (B, L).

    index (B or 1, L, k) (``topk_select``'s, or a ``TopKSelection``'s ``.index``): the scores of the selected keys
    only, I (B, L, k) slot by slot (0 at a -1 slot), gathered block of queries by block (``block_size``; None: by
    what a block holds): the sparse stage's loss in O(L · k) memory."""
    x, q_resid = _check_inputs(c, params, x, q_resid, positions)
    if index is not None:
        index = check_index(index, x.shape[1])
        if index.shape[:2] not in ((x.shape[0], x.shape[1]), (1, x.shape[1])):
            raise ValueError(f"index with shape {index.shape} must be (B, L, k) or (1, L, k), x is {x.shape}")
        index = np.broadcast_to(index, (x.shape[0], *index.shape[1:]))  # (B, L, k)
        block_size = None if block_size is None else as_int(block_size, "block_size", minimum=1)
    (Q, w), s_q = indexer_queries_forward(x, q_resid, params, c, positions, check=False)  # F1
    K, s_k = indexer_keys_forward(x, params, c, positions, check=False)  # F2
    if index is None:
        scores, s_s = indexer_scores_forward(Q, w, K)  # F3: (B, L, L)
        return scores, (s_q, s_k, s_s, indexer_scores_backward)
    scores, s_s = indexer_selected_scores_forward(Q, w, K, index, block_size)  # F3: (B, L, k)
    return scores, (s_q, s_k, s_s, indexer_selected_scores_backward)


def indexer_backward(dI, cache) -> dict[str, np.ndarray]:
    """dI (B, L, L), or (B, L, k) after ``indexer_forward(.., index=)`` -> {"x", "q_resid", W_iq, W_ik, ik_norm,
    ik_norm_b, W_iw}."""
    s_q, s_k, s_s, scores_backward = cache
    dQ, dw, dK = scores_backward(dI, s_s)  # ← F3
    dx_k, grads = indexer_keys_backward(dK, s_k)  # ← F2
    dx_q, dq_resid, g_q = indexer_queries_backward(dQ, dw, s_q)  # ← F1
    return {"x": dx_q + dx_k, "q_resid": dq_resid, **grads, **g_q}


def indexer_topk(Q, w, K, k: int, mask=None, block_size: int = QUERY_BLOCK) -> np.ndarray:
    """The selection without the (B, Lq, Lk) scores: Q (B, nI, Lq, dI), w (B, Lq, nI), K (B, Lk, dI), k, mask (as
    ``topk_select``'s) -> index (B, Lq, min(k, Lk)), block of queries by block (O(block_size · nI · Lk))."""
    k = as_int(k, "k", minimum=1)
    B, _, Lq, _ = Q.shape
    mask = check_selection_mask(mask, (B, Lq, K.shape[1]))
    parts = []
    for i0 in range(0, Lq, block_size):
        i1 = min(i0 + block_size, Lq)
        scores, _ = indexer_scores_forward(Q[:, :, i0:i1], w[:, i0:i1], K)  # (B, n, Lk)
        parts.append(topk_select(scores, k, mask_rows(mask, i0, i1, K.shape[1]), block_size))
    return np.concatenate(parts, axis=1)  # (B, Lq, k)
