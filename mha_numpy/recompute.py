"""``MultiHeadAttention(recompute=True)``: attention head group by head group, keeping only the inputs.

Heads are independent until the output projection, and that projection is a sum over heads:

    output = Σ_groups merge(context_g) W_o[:, cols_g]ᵀ + b_o        cols_g = the g·d features of group g's heads

So the forward runs one group of heads at a time: the rows of W_q, W_k, W_v of those heads project the
inputs (``linear_forward`` on weight slices), the heads are split (and rotated by RoPE), the kernel runs on
them (its mask, bias and dropout mask sliced to those heads), and the group's share of the output projection
is added into the output. The cache keeps references to the inputs and the call's arguments, not Q, K, V or
the context: the backward recomputes each group's forward (as activation checkpointing does) and then runs
the same backward steps as ``MultiHeadAttention.backward`` for that group, accumulating the gradients of the
inputs and writing the group's rows (W_q, W_k, W_v, b_*, rel_bias) and columns (W_o) of the parameters'.

The group is one key/value head and the H / Hkv query heads that read it (one head without grouped-query
attention): the smallest group that keeps whole kv groups, so that only one head's q, k, v, context and
their gradients, (L, d) arrays, exist at a time. Measured (tracemalloc, chunked, forward + backward at
B = 1, L = 16384, E = 256, H = 4, float32, beyond the output and the gradients): 49 MiB with one head a group,
86 MiB with two, 130 MiB without recompute. The chunked backward splits a lone head's key blocks across its
threads, so one head a group still uses them all. The cost is one more forward of the projections and of the
kernel. Sampled dropout draws each group's keep-mask from a generator seeded by (one seed per call, the
group's first head), so the backward replays exactly the forward's mask (a different draw than
``recompute=False`` makes with the same module seed; the same distribution). A KV cache is refused.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from . import functional as F
from .kernels import AttentionArgs


@dataclass
class RecomputeCache:
    """What the recomputing backward needs: the inputs and the call's arguments (nothing of size L × d).

    query (B, Lq, E), key (B, Lk, kdim), value (B, Lk, vdim) as given (references: change them in place between
    forward and backward and the backward sees the new values); args: the checked arguments of the whole call
    (mask, dropout p, a given keep-mask; the score biases are made per group); seed: the call's dropout seed or
    None; positions: RoPE positions of queries and keys; owner: the module.
    ``attn_weights`` and ``dropout_mask`` (B, H, Lq, Lk) are recomputed group by group when read.
    """

    query: np.ndarray
    key: np.ndarray
    value: np.ndarray
    args: AttentionArgs
    seed: int | None
    positions: tuple
    owner: object

    def _heads(self, read) -> np.ndarray:
        """(B, H, Lq, Lk): ``read(kernel cache)`` of every group, concatenated over heads."""
        parts = [read(_group_forward(self.owner, self, hs)[2]) for hs in groups(self.owner)]
        return None if parts[0] is None else np.concatenate(parts, axis=1)

    @property
    def attn_weights(self) -> np.ndarray:
        """(B, H, Lq, Lk) attention weights after softmax, before dropout (recomputed now)."""
        return self._heads(lambda attention: attention.attn_weights)

    @property
    def dropout_mask(self) -> np.ndarray | None:
        """(B, H, Lq, Lk) bool keep-mask of dropout, or None (recomputed now)."""
        return self._heads(lambda attention: attention.dropout_mask)


def groups(module) -> list[slice]:
    """The head groups: one key/value head and its H / Hkv query heads each."""
    g = module.num_heads // module.num_kv_heads
    return [slice(h, h + g) for h in range(0, module.num_heads, g)]


def _rows(module, hs: slice) -> tuple[slice, slice]:
    """-> the g·d rows of W_q (columns of W_o) of the heads ``hs``, the d rows of W_k, W_v of their key/value head."""
    d, kv = module.head_dim, hs.start // (module.num_heads // module.num_kv_heads)
    return slice(hs.start * d, hs.stop * d), slice(kv * d, (kv + 1) * d)


def _heads_of(a, hs: slice):
    """An array broadcastable to (B, H, Lq, Lk), cut to the heads ``hs`` (a view; a broadcast head axis stays)."""
    if a is None:
        return None
    a = a.reshape((1,) * (4 - a.ndim) + a.shape)  # (b, h, lq, lk), a view
    return a if a.shape[1] == 1 else a[:, hs]


def _group_args(module, cache: RecomputeCache, hs: slice, bias) -> AttentionArgs:
    """The call's arguments for the heads ``hs``: mask, keep-mask and bias cut to them, their own dropout draws."""
    args = cache.args
    B, H, Lq, Lk = args.shape
    rng = None if cache.seed is None else np.random.default_rng((cache.seed, hs.start))  # the same in the backward
    if module.alibi:  # ALiBi's fixed penalty, these heads' slopes
        alibi = F.alibi_bias(H, Lq, Lk, offset=Lk - Lq, dtype=module.dtype)[:, hs]  # (1, g, Lq, Lk)
        bias = alibi if bias is None else bias + alibi
    shape = (B, hs.stop - hs.start, Lq, Lk)
    return replace(args, shape=shape, mask=_heads_of(args.mask, hs), keep=_heads_of(args.keep, hs), bias=bias, rng=rng)


def _group_forward(module, cache: RecomputeCache, hs: slice):
    """The forward of the heads ``hs`` (g = hs.stop - hs.start) up to their context.

    -> context (B, g, Lq, d), the steps' caches by name (as ``MHACache.steps``), the kernel's cache.
    """
    P, s = module.params, {}
    rows, kv_rows = _rows(module, hs)
    b = {name: P[name][r] if module.bias else None for name, r in (("b_q", rows), ("b_k", kv_rows), ("b_v", kv_rows))}
    B, _, Lq, Lk = cache.args.shape
    kernel = module.kernel.choose((B, hs.stop - hs.start, Lq, Lk))  # this group's kernel; its threads run the products
    mm = kernel.matmul
    q, s["q_proj"] = F.linear_forward(cache.query, P["W_q"][rows], b["b_q"], mm)  # F1: (B, Lq, g·d)
    k, s["k_proj"] = F.linear_forward(cache.key, P["W_k"][kv_rows], b["b_k"], mm)  # F2: (B, Lk, d)
    v, s["v_proj"] = F.linear_forward(cache.value, P["W_v"][kv_rows], b["b_v"], mm)  # F3: (B, Lk, d)
    Q, s["q_split"] = F.split_heads_forward(q, hs.stop - hs.start)  # F4: (B, g, Lq, d)
    K, s["k_split"] = F.split_heads_forward(k, 1)  # F5: (B, 1, Lk, d)
    V, s["v_split"] = F.split_heads_forward(v, 1)  # F6: (B, 1, Lk, d)
    if module.rope_theta is not None:
        pos_q, pos_k = cache.positions
        Q, s["q_rope"] = F.rope_forward(Q, pos_q, module.rope_theta)  # F7: (B, g, Lq, d)
        K, s["k_rope"] = F.rope_forward(K, pos_k, module.rope_theta)  # F8: (B, 1, Lk, d)
    K, s["k_repeat"] = F.repeat_kv_forward(K, Q.shape[1])  # F9: (B, g, Lk, d); g = 1: K itself
    V, s["v_repeat"] = F.repeat_kv_forward(V, Q.shape[1])  # F10: (B, g, Lk, d)
    bias = None
    if "rel_bias" in P:  # these heads' rows of the learned table
        bias, s["rel_bias"] = F.relative_position_bias_forward(P["rel_bias"][hs], Lq, Lk)  # F11: (1, g, Lq, Lk)
    context, attention = kernel.run(Q, K, V, _group_args(module, cache, hs, bias))  # F12: (B, g, Lq, d)
    return context, s, attention


def forward(module, query, key, value, args: AttentionArgs, positions: tuple):
    """query (B, Lq, E), key (B, Lk, kdim), value (B, Lk, vdim), checked -> output (B, Lq, E), RecomputeCache."""
    P = module.params
    cache = RecomputeCache(query, key, value, args, args.seed(), positions, module)
    output = None
    for hs in groups(module):
        context, _, attention = _group_forward(module, cache, hs)  # (B, g, Lq, d)
        merged, _ = F.merge_heads_forward(context)  # F13: (B, Lq, g·d)
        W_o, mm = P["W_o"][:, _rows(module, hs)[0]], attention.kernel.matmul  # (E, g·d) the group's columns
        if output is None:  # the first group brings b_o
            output, _ = F.linear_forward(merged, W_o, P.get("b_o"), mm)  # F14: (B, Lq, E)
        else:
            output += F.linear_forward(merged, W_o, None, mm)[0]  # F14: (B, Lq, g·d) @ (g·d, E) -> (B, Lq, E), summed
    return output, cache


def backward(module, d_output: np.ndarray, cache: RecomputeCache) -> dict[str, np.ndarray]:
    """d_output (B, Lq, E), checked -> the gradients of ``MultiHeadAttention.backward``, group by group."""
    P = module.params
    g = {name: np.zeros_like(p) for name, p in P.items()}  # filled group by group (rows / columns)
    if module.bias:
        g["b_o"] = d_output.sum(axis=(0, 1))  # ← F14: (E,)
    dy2 = d_output.reshape(-1, module.embed_dim)  # (B·Lq, E)
    for hs in groups(module):
        context, s, attention = _group_forward(module, cache, hs)  # recomputed: (B, g, Lq, d)
        rows, kv_rows = _rows(module, hs)  # the group's columns of W_o and rows of W_q; rows of W_k, W_v
        merged, merge = F.merge_heads_forward(context)  # F13: (B, Lq, g·d)
        mm, gd = attention.kernel.matmul, rows.stop - rows.start  # the products on the kernel's threads; g·d
        g["W_o"][:, rows] = mm(dy2.T, merged.reshape(len(dy2), gd))  # ← F14: (E, B·Lq) @ (B·Lq, g·d)
        d_merged = mm(dy2, P["W_o"][:, rows]).reshape(*d_output.shape[:2], gd)  # ← F14: (B·Lq, E) @ (E, g·d)
        d_context = F.merge_heads_backward(d_merged, merge)  # ← F13: (B, g, Lq, d)
        del context, merged, d_merged
        dQ, dK, dV, d_bias = attention.kernel.backward(d_context, attention)  # ← F12: (B, g, L, d) each
        del attention, d_context
        if "rel_bias" in s:
            g["rel_bias"][hs] = F.relative_position_bias_backward(d_bias, s["rel_bias"])  # ← F11: (g, 2R + 1)
        dK = F.repeat_kv_backward(dK, s["k_repeat"])  # ← F9: (B, 1, Lk, d), the sum over the group
        dV = F.repeat_kv_backward(dV, s["v_repeat"])  # ← F10: (B, 1, Lk, d)
        if "q_rope" in s:
            dQ = F.rope_backward(dQ, s["q_rope"])  # ← F7: (B, g, Lq, d)
            dK = F.rope_backward(dK, s["k_rope"])  # ← F8: (B, 1, Lk, d)
        for x, dX, split, proj, W, b, W_rows in (
            ("query", dQ, "q_split", "q_proj", "W_q", "b_q", rows),
            ("key", dK, "k_split", "k_proj", "W_k", "b_k", kv_rows),
            ("value", dV, "v_split", "v_proj", "W_v", "b_v", kv_rows),
        ):
            dx = F.split_heads_backward(dX, s[split])  # ← F4-F6: (B, L, g·d or d)
            d_in, g[W][W_rows], db = F.linear_backward(dx, s[proj], mm)  # ← F1-F3: (B, L, in), (·, in), (·,)
            if module.bias:
                g[b][W_rows] = db
            if x in g:
                g[x] += d_in  # the next groups add theirs
            else:
                g[x] = d_in
            del dx, d_in, dX
        del dQ, dK, dV  # before the next group's recompute: one group's arrays at a time
    return {name: g[name] for name in ("query", "key", "value", *P)}
