"""Attention over each query's selected keys only (DeepSeek Sparse Attention's second half): gather, never (Lq, Lk).

For query i with selected keys S_i (``topk.topk_select``: at most k of them, shared by the heads, as in DSA):

    s_ij = q_i · k_j · scale    (j in S_i)        P_ij = exp(s_ij - lse_i),  lse_i = log Σ_{j in S_i} exp(s_ij)
    o_i  = Σ_{j in S_i} P_ij v_j

which is dense attention with the mask "j in S_i" (the tests check it against torch autograd of exactly that),
computed on the gathered keys: a block of n queries gathers its n · k keys and values, (B, Hk, n, k, d), so the
memory is O(n · k) per block and O(L · k) for the index: nothing Lq × Lk is made. The backward treats the
selection as fixed (it is an argmax: no gradient reaches the scores that chose it) and recomputes each block's
P from the kept lse, as FlashAttention does:

    dP = dO Vᵀ,   D_i = Σ_c dO_ic O_ic,   dS = P ∘ (dP - D),   dQ = dS K · scale
    dK_j = Σ_{i: j in S_i} dS_ij q_i · scale,   dV_j = Σ_{i: j in S_i} P_ij dO_i

The last two are scatters: a key chosen by many queries sums their terms, and a key chosen by none gets zero.
``scatter_keys`` makes a block's chosen keys unique and sums the terms of each by one product (keys × queries) @
(queries × features), never ``dk[idx] += ...`` (which keeps one term of each repeated index: the trap
``models.layers.embedding_backward`` names), and deterministically. A segment sum over the sorted key rows
(``np.add.reduceat``) spent most of the backward in its per-key loop: the backward took 1.50 CPU seconds with it and
0.68 with the product on one BLAS thread (L = 4096, k = 512, H = 4 sharing one key head, d = 64, float32).

Each block's products are small (per query (g × d) @ (d × k)): they run with BLAS on one thread
(``threads.blas_single_threaded``), as the vectorized kernel's small heads do. Measured on this 2-core machine under
load: the scatter's product 0.76 ms on one thread, 7.9 ms on BLAS's two (L = 4096, k = 512, a block of 58 queries).

Keys may be shared by groups of query heads (Hk divides H: grouped-query or MQA, as MLA's absorbed form); with MLA's
expanded heads Hk = H. ``SparseKernel`` is this pair behind the kernel protocol, so ``MultiHeadAttention`` (and MLA)
runs it with a ``TopKSelection`` as its mask.
"""

from __future__ import annotations

import numpy as np

from .._checks import as_float_array, as_int, check_d_context, check_d_lse, default_scale
from ..kernels.base import AttentionArgs, AttentionGrads, Kernel
from ..threads import blas_single_threaded
from .topk import TopKSelection, check_index, check_index_allowed


class SparseCache:
    """What the backward needs: q, k, v, the index (B, Lq, k), the scale, the context and each row's lse (B, H, Lq)
    float64 (-inf for a query with no key). ``attn_weights``, ``scores``, ``masked_scores`` follow the kernels'
    cache contract (``kernels.base``) and are built when read, (B, H, Lq, Lk): for small checks only."""

    dropout_mask = None

    def __init__(self, q, k, v, index, scale, context, lse, block_size, kernel=None):
        self.q, self.k, self.v, self.index, self.scale = q, k, v, index, scale
        self.context, self.lse, self.block_size, self.kernel = context, lse, block_size, kernel

    def selected_weights(self) -> np.ndarray:
        """(B, H, Lq, k) the weights of the selected keys (0 at -1 slots): O(L · k)."""
        return _weights(self)[0]

    @property
    def attn_weights(self) -> np.ndarray:
        """(B, H, Lq, Lk): the selected keys' weights scattered into the dense map (built now, Lq · Lk)."""
        return _dense(self, _weights(self)[0], 0.0)

    @property
    def scores(self) -> np.ndarray:
        """(B, H, Lq, Lk) q·k · scale at the selected keys; the others are not computed: -inf, as masked."""
        return _dense(self, _weights(self)[1], -np.inf)

    masked_scores = scores


def _gather(x: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """x (B, Hk, Lk, c), idx (B, n, k) keys (-1 read as key 0, masked later) -> (B, Hk, n, k, c) the rows."""
    b = np.arange(x.shape[0])[:, None, None]  # (B, 1, 1)
    rows = x.transpose(0, 2, 1, 3)[b, np.maximum(idx, 0)]  # (B, Lk, Hk, c)[b, idx] -> (B, n, k, Hk, c), a copy
    return rows.transpose(0, 3, 1, 2, 4)  # (B, Hk, n, k, c)


def _query_block(x: np.ndarray, Hk: int, i0: int, i1: int) -> np.ndarray:
    """x (B, H, Lq, c) -> its queries i0 ... i1 - 1 as (B, Hk, n, g, c): the g = H / Hk heads of each key head."""
    B, H, _, c = x.shape
    return x[:, :, i0:i1].reshape(B, Hk, H // Hk, i1 - i0, c).transpose(0, 1, 3, 2, 4)  # (B, Hk, n, g, c)


def _heads(x: np.ndarray) -> np.ndarray:
    """(B, Hk, n, g, c) -> (B, H, n, c), the inverse of ``_query_block``'s reshape."""
    B, Hk, n, g, c = x.shape
    return x.transpose(0, 1, 3, 2, 4).reshape(B, Hk * g, n, c)


BLOCK_ENTRIES = 2**22  # numbers a block of queries may gather and score at once (32 MiB in float64)


def block_queries(shape_q, shape_k, dv: int, k: int, block_size=None) -> int:
    """Queries a block: ``block_size``, or (None) as many as keep the block's gathered keys and values
    (Hk·(d + dv) a chosen key) and its scores, weights and their gradients (~3·H a chosen key) under
    ``BLOCK_ENTRIES``: about 14 queries at k = 2048, H = 4, Hk = 1, d = dv = 64; at most 256."""
    if block_size is not None:
        return as_int(block_size, "block_size", minimum=1)
    per_query = shape_q[0] * k * (shape_k[1] * (shape_k[3] + dv) + 3 * shape_q[1])
    return max(1, min(256, BLOCK_ENTRIES // max(1, per_query)))


def _check(q, k, v, index, mask, block_size):
    """ValueError naming the argument, before any arithmetic -> q, k, v, index (B, Lq, k) int32, block size."""
    q, k, v = (as_float_array(x, n, ndim=4) for x, n in ((q, "q"), (k, "k"), (v, "v")))
    (B, H, Lq, d), (Bk, Hk, Lk, dk) = q.shape, k.shape
    if not q.dtype == k.dtype == v.dtype:
        raise ValueError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if Bk != B or v.shape[:3] != k.shape[:3] or dk != d or Hk < 1 or H % Hk:
        raise ValueError(f"q (B, H, Lq, d) = {q.shape}, k (B, Hk, Lk, d) = {k.shape}, v (B, Hk, Lk, dv) = {v.shape}: "
                         "the same B, Hk dividing H, k and v the same keys, q and k the same d")  # fmt: skip
    idx = check_index(index, Lk)
    if idx.shape[:2] not in ((B, Lq), (1, Lq)):
        raise ValueError(f"index with shape {idx.shape} must be (B, Lq, k) or (1, Lq, k) with B, Lq = {B}, {Lq}")
    if mask is not None:
        check_index_allowed(idx, mask, "index")
    return q, k, v, np.broadcast_to(idx, (B, Lq, idx.shape[2])), block_queries(q.shape, k.shape, v.shape[3],
                                                                               idx.shape[2], block_size)  # fmt: skip


def sparse_attention_forward(q, k, v, index, scale=None, mask=None, block_size: int | None = None, check=True):
    """q (B, H, Lq, d), k (B, Hk, Lk, d), v (B, Hk, Lk, dv), index (B, Lq, k) int (-1: no key) -> context
    (B, H, Lq, dv), cache. Softmax over each query's selected keys only (a query with none: zero context, lse -inf).

    scale: None (1/√d) or a number. mask: None, or the mask the selection must respect (bool (b, Lq, Lk) or
    (b, 1, Lq, Lk), or a StructuredMask, e.g. causal): a selected key it blocks is a ValueError naming ``index``.
    block_size: queries per block (memory O(block_size · k · H · d) at a time; None: ``block_queries``'s choice).
    float32 stays float32 (lse float64).
    """
    if check:
        q, k, v, index, block_size = _check(q, k, v, index, mask, block_size)
    scale = default_scale(q.shape[-1], scale)
    block_size = block_queries(q.shape, k.shape, v.shape[3], index.shape[2], block_size)
    B, H, Lq, _ = q.shape
    context = np.empty((B, H, Lq, v.shape[-1]), dtype=q.dtype)
    lse = np.empty((B, H, Lq), dtype=np.float64)
    with blas_single_threaded():  # small products a block: BLAS's threads only cost (see the docstring)
        for i0 in range(0, Lq, block_size):
            i1 = min(i0 + block_size, Lq)
            P, _, _, lse_b = _block_weights(q, k, index, scale, i0, i1)  # F1-F4: (B, Hk, n, g, k)
            O = P @ _gather(v, index[:, i0:i1])  # F5: (B, Hk, n, g, k) @ (B, Hk, n, k, dv) -> (B, Hk, n, g, dv)
            context[:, :, i0:i1] = _heads(O)  # (B, H, n, dv)
            lse[:, :, i0:i1] = _heads(lse_b[..., None])[..., 0]  # (B, H, n)
    return context, SparseCache(q, k, v, index, scale, context, lse, block_size)


def _block_weights(q, k, index, scale, i0, i1, lse=None):
    """The weights of queries i0 ... i1 - 1 over their selected keys -> P (B, Hk, n, g, k), the gathered keys
    (B, Hk, n, k, d), the queries (B, Hk, n, g, d) and the lse (B, Hk, n, g) float64; from the kept lse when given
    (the backward's recomputation: the same P, no second max or sum)."""
    Hk = k.shape[1]
    valid = (index[:, i0:i1] >= 0)[:, None, :, None, :]  # (B, 1, n, 1, k): -1 slots hold no key
    Qb, Kg = _query_block(q, Hk, i0, i1), _gather(k, index[:, i0:i1])  # F1: (B, Hk, n, g, d), (B, Hk, n, k, d)
    S = Qb @ Kg.swapaxes(-1, -2) * scale  # F2: (B, Hk, n, g, d) @ (B, Hk, n, d, k) -> (B, Hk, n, g, k)
    S = np.where(valid, S, -np.inf)  # F3: (B, Hk, n, g, k)
    if lse is None:
        m = S.max(axis=-1, keepdims=True)  # (B, Hk, n, g, 1), -inf for a query with no key
        m = np.where(np.isfinite(m), m, 0.0)
        E = np.exp(S - m)  # (B, Hk, n, g, k): 0 at the -1 slots
        ell = E.sum(axis=-1, keepdims=True)  # (B, Hk, n, g, 1)
        P = E / np.where(ell > 0, ell, 1.0)  # F4: a row with no key: all 0, no NaN
        ell = ell[..., 0].astype(np.float64)  # (B, Hk, n, g)
        lse = np.where(ell > 0, m[..., 0] + np.log(np.where(ell > 0, ell, 1.0)), -np.inf)  # float64
        return P, Kg, Qb, lse
    finite = np.isfinite(lse)[..., None]  # (B, Hk, n, g, 1)
    shift = np.where(finite, lse[..., None], 0.0).astype(q.dtype)
    P = np.where(valid & finite, np.exp(S - shift), 0.0).astype(q.dtype, copy=False)  # F4 again, from the lse
    return P, Kg, Qb, lse


def sparse_attention_backward(d_context, cache: SparseCache, d_lse=None):
    """d_context (B, H, Lq, dv) (and d_lse (B, H, Lq), the gradient of ``cache.lse``, or None) -> dq (B, H, Lq, d),
    dk (B, Hk, Lk, d), dv (B, Hk, Lk, dv): the selection fixed, the chosen keys' gradients summed (scattered)."""
    q, k, v, index, scale = cache.q, cache.k, cache.v, cache.index, cache.scale
    B, H, Lq, _ = q.shape
    Hk = k.shape[1]
    d_context = check_d_context(d_context, cache.context.shape, q.dtype)  # (B, H, Lq, dv)
    d_lse = check_d_lse(d_lse, cache.lse.shape, q.dtype)  # (B, H, Lq) or None
    dq, dk, dv = np.empty_like(q), np.zeros_like(k), np.zeros_like(v)
    with blas_single_threaded():  # small products a block: BLAS's threads only cost (see the docstring)
        for i0 in range(0, Lq, cache.block_size):
            i1 = min(i0 + cache.block_size, Lq)
            lse = _query_block(cache.lse[..., None], Hk, i0, i1)[..., 0]  # (B, Hk, n, g)
            P, Kg, Qb, _ = _block_weights(q, k, index, scale, i0, i1, lse)  # ← F4 ... F1 recomputed: (B, Hk, n, g, k)
            Vg = _gather(v, index[:, i0:i1])  # (B, Hk, n, k, dv)
            dO, O = _query_block(d_context, Hk, i0, i1), _query_block(cache.context, Hk, i0, i1)  # (B, Hk, n, g, dv)
            dP = dO @ Vg.swapaxes(-1, -2)  # ← F5: (B, Hk, n, g, dv) @ (B, Hk, n, dv, k) -> (B, Hk, n, g, k)
            D = np.sum(dO * O, axis=-1, keepdims=True)  # (B, Hk, n, g, 1) Σ_c dO O = Σ_j P dP
            if d_lse is not None:
                D = D - _query_block(d_lse[..., None], Hk, i0, i1)  # ∂lse/∂s = P joins the row term
            dS = P * (dP - D)  # ← F4 (F3: the -1 slots have P = 0, so dS = 0 there)
            dq[:, :, i0:i1] = _heads(dS @ Kg * scale)  # ← F2: (B, Hk, n, g, k) @ (B, Hk, n, k, d)
            for b in range(B):
                scatter_keys(dk[b], index[b, i0:i1], dS[b] * scale, Qb[b])  # ← F2, F1: dK_j = Σ_i dS_ij q_i · scale
                scatter_keys(dv[b], index[b, i0:i1], P[b], dO[b])  # ← F5: dV_j = Σ_i P_ij dO_i
    return dq, dk, dv


def scatter_keys(out: np.ndarray, index: np.ndarray, coef: np.ndarray, rows: np.ndarray) -> None:
    """out[:, j] += Σ_{i, s: index[i, s] = j} Σ_g coef[:, i, g, s] · rows[:, i, g] for every chosen key j, in place
    on ``out`` (Hk, Lk, c), our own array. index (n, k) a block's chosen keys (-1: none), coef (Hk, n, g, k) a value
    per query head and slot (dS or P), rows (Hk, n, g, c) per query head (q or dO).

    A key chosen by several queries of the block sums their terms: the block's keys are made unique (U of them) and
    the sum is one product W (Hk, U, n·g) @ rows (Hk, n·g, c), with W[:, u, (i, g)] = coef[:, i, g, s] where
    index[i, s] is the u-th key. A query chooses a key once, so W is filled by plain assignment, no two terms in one
    entry; ``out[index] += terms`` would keep one term of a repeated key (the trap ``embedding_backward`` names).
    The -1 slots go to a last row of W that is dropped (their coef is 0 anyway). Deterministic: one product."""
    valid = index >= 0
    keys, inverse = np.unique(index[valid], return_inverse=True)  # (U,) sorted, (number valid,)
    n, k = index.shape
    Hk, _, g, _ = coef.shape
    pos = np.full((n, k), keys.size)  # (n, k) the row of W of each slot; -1 slots: the dropped last row
    pos[valid] = inverse
    W = np.zeros((Hk, keys.size + 1, n, g), dtype=coef.dtype)
    W[:, pos, np.arange(n)[:, None], :] = coef.transpose(0, 1, 3, 2)  # (Hk, n, k, g) into (Hk, U + 1, n, g)
    out[:, keys] += (W.reshape(Hk, keys.size + 1, n * g) @ rows.reshape(Hk, n * g, -1))[:, :-1]  # (Hk, U, c)


def _weights(cache: SparseCache):
    """(B, H, Lq, k) weights and scores of the selected keys, recomputed from the lse."""
    q, k, index, Hk = cache.q, cache.k, cache.index, cache.k.shape[1]
    P_all, S_all = [], []
    for i0 in range(0, q.shape[2], cache.block_size):
        i1 = min(i0 + cache.block_size, q.shape[2])
        lse = _query_block(cache.lse[..., None], Hk, i0, i1)[..., 0]
        P, Kg, Qb, _ = _block_weights(q, k, index, cache.scale, i0, i1, lse)
        P_all.append(_heads(P))  # (B, H, n, k)
        S_all.append(_heads(Qb @ Kg.swapaxes(-1, -2) * cache.scale))
    return np.concatenate(P_all, axis=2), np.concatenate(S_all, axis=2)


def _dense(cache: SparseCache, values: np.ndarray, fill: float) -> np.ndarray:
    """(B, H, Lq, k) values at the selected keys -> (B, H, Lq, Lk), ``fill`` elsewhere."""
    B, H, Lq, k = values.shape
    out = np.full((B, H, Lq, cache.k.shape[2]), fill, dtype=values.dtype)
    b, i, slot = np.nonzero(cache.index >= 0)  # (N,) each
    out[b, :, i, cache.index[b, i, slot]] = values[b, :, i, slot]  # (N, H) both sides
    return out


class SparseKernel(Kernel):
    """``sparse_attention_forward`` / ``_backward`` behind the kernel protocol: the mask must be a
    ``topk.TopKSelection`` (alone, or ANDed with masks it must respect: ``checked_index``); a bias, score terms,
    dropout and sinks are refused (DSA has none). Not registered: ``MultiHeadAttention(impl=SparseKernel())``, or
    ``mla.kernel = SparseKernel()``. ``score_arrays = 0``: it keeps nothing Lq × Lk."""

    name = "sparse"
    score_arrays = 0

    def __init__(self, block_size: int | None = None) -> None:
        self.block_size = None if block_size is None else as_int(block_size, "block_size", minimum=1)

    def run(self, q, k, v, args: AttentionArgs):
        """The selection's keys only, from ``args.mask``'s index."""
        if not isinstance(args.mask, TopKSelection):
            raise ValueError(f"mask: the sparse kernel attends to the keys of a sparse.TopKSelection, got "
                             f"{type(args.mask).__name__}")  # fmt: skip
        for name, value in (("bias", args.bias), ("sinks", args.sinks), ("key_index", args.key_index)):
            if value is not None:
                raise ValueError(f"{name}: the sparse kernel takes none (DeepSeek Sparse Attention has none)")
        if args.score_mods or args.dropout:
            raise ValueError("score terms and dropout: the sparse kernel takes neither (DSA has none)")
        index = args.mask.checked_index()  # (b, Lq, k)
        index = np.broadcast_to(index, (q.shape[0], *index.shape[1:]))  # (B, Lq, k)
        context, cache = sparse_attention_forward(q, k, v, index, args.scale, None, self.block_size, check=False)
        cache.kernel = self
        return context, cache

    def backward(self, d_context, cache: SparseCache, d_lse=None):
        """-> AttentionGrads (dq, dk, dv, None, None)."""
        return AttentionGrads(*sparse_attention_backward(d_context, cache, d_lse))

    def __repr__(self) -> str:
        return f"SparseKernel(block_size={self.block_size})"
