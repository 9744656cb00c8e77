"""Split-KV attention ("flash-decoding"): the keys and values cut into S shards, each query attended per shard by
another kernel, and the S partial results merged exactly (``functional.merge_attention_forward``).

Decoding attends one query to a long KV cache: a single (1 × Lk) row gives one device (one thread block, one MPI
rank) too little work, so the cache is cut along its positions, every shard s gives a partial context C_s and its
rows' log-sum-exp lse_s, and the merge weighs them by w_s = exp(lse_s - lse):

    shards      keys j of shard s: the positions with (j // block) % S = s (block-cyclic; block ≥ Lk: contiguous)
    per shard   C_s, cache_s = inner.run(q, K_s, V_s, args cut to the shard's keys)
    merge       (C, lse) = merge_attention_forward([C_s], [cache_s.lse])
    backward    dC_s, dlse_s = merge_attention_backward(dC, d_lse), then inner.backward(dC_s, cache_s, dlse_s):
                dq = Σ_s dq_s, each key's dk, dv from its shard, the bias's gradient cut the same way

What is cut with the keys: the mask (a ``StructuredMask``'s entries are built, as the vectorized kernel does), the
bias and the dropout keep-mask (drawn once for all keys, as the vectorized kernel draws it, then cut). What is not:
the queries, the scale and the score mods (elementwise). The attention sinks (one logit per head in every row's
denominator) are a key of value 0: they join the first shard only. Every head's query sees every shard (GQA's
repeated K/V heads reach the kernel as H heads, as for every kernel).

A shard with no key (S > Lk) is left out. Equal to the kernel on all keys to rounding (tests/test_split_kv.py,
1e-12 in float64), with one exception the lse convention cannot carry: a row blocked in every shard by a finite
"minus infinity" (finfo.min, Hugging Face's) has lse_s = finfo.min + log n_s, which rounds to finfo.min, so the
merge weighs such a row's shards equally, not by their n_s keys (the unsplit softmax is uniform over the keys).
Use bool masks or -inf, as mha_numpy does inside.

``MultiHeadAttention(impl=SplitKVKernel(num_shards=4))`` decodes with it (``KVCache``, ``StreamingKVCache``); the
ring (docs/distributed.md) runs the same shard-then-merge with one shard per MPI rank.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from .. import functional as F
from .._checks import as_int, check_d_context, check_d_lse
from ..masks import StructuredMask
from .base import AttentionArgs, AttentionGrads, Kernel, add_score_params
from .registry import get_kernel


def key_shards(Lk: int, num_shards: int, block: int = 1) -> list[np.ndarray]:
    """The key positions of each shard, block-cyclic: position j goes to shard (j // block) % num_shards.

    -> num_shards int arrays (some empty when Lk < num_shards · block), together 0 ... Lk - 1 once each."""
    owner = (np.arange(Lk) // block) % num_shards  # (Lk,) the shard of each position
    return [np.flatnonzero(owner == s) for s in range(num_shards)]


def _cut(a, keys: np.ndarray, shape):
    """A mask, bias or keep-mask broadcastable to ``shape`` (B, H, Lq, Lk) -> its columns ``keys`` (a copy), or None;
    an array that broadcasts over the keys (last axis 1) stays as it is."""
    if a is None:
        return None
    a = np.asarray(a)  # a StructuredMask's entries, (b, 1, Lq, Lk)
    a = a.reshape((1,) * (4 - a.ndim) + a.shape)  # (b, h, lq, lk), lk = Lk or 1
    return a if a.shape[-1] == 1 else a[..., keys]  # (b, h, lq, len(keys))


@dataclass
class SplitKVCache:
    """The shards' caches and the merge's; the cache contract's arrays assembled from the shards when read."""

    kernel: Kernel
    parts: list  # each shard's inner cache
    keys: list[np.ndarray]  # each shard's key positions
    merge: tuple  # merge_attention_forward's cache
    lse: np.ndarray  # (B, H, Lq) float64, the merged rows' log-sum-exp
    shape: tuple  # (B, H, Lq, Lk)
    bias_shape: tuple | None  # the bias's own shape (its gradient's), or None

    def _assemble(self, name: str, weigh: bool = False):
        """(B, H, Lq, Lk): the shards' arrays ``name`` in their key columns (weights times their shard's weight)."""
        parts = [getattr(c, name) for c in self.parts]
        if any(p is None for p in parts):
            return None
        out = np.empty(self.shape, dtype=parts[0].dtype)  # every column belongs to one shard
        for p, keys, w in zip(parts, self.keys, self.merge[1]):
            out[..., keys] = p * w[..., None].astype(p.dtype) if weigh else p  # (B, H, Lq, len(keys))
        return out

    @property
    def scores(self):
        """(B, H, Lq, Lk) the shards' scores in their key columns."""
        return self._assemble("scores")

    @property
    def masked_scores(self):
        """(B, H, Lq, Lk) the shards' masked scores in their key columns."""
        return self._assemble("masked_scores")

    @property
    def attn_weights(self):
        """(B, H, Lq, Lk): each shard's weights times its weight in the whole softmax, w_s = exp(lse_s - lse)."""
        return self._assemble("attn_weights", weigh=True)

    @property
    def dropout_mask(self):
        """(B, H, Lq, Lk) the shards' keep-masks in their key columns, or None."""
        return self._assemble("dropout_mask")


class SplitKVKernel(Kernel):
    """Attention over S shards of the keys by ``inner`` (a kernel name or object), merged exactly.

    num_shards: S ≥ 1. block: the shards' block-cyclic unit (positions j with (j // block) % S = s form shard s).
    order: the merge's ("flat", "sequential", "tree"; ``functional.merge_attention_forward``).
    """

    name = "split_kv"

    def __init__(self, num_shards: int = 2, inner="vectorized", block: int = 1, order: str = "flat"):
        self.num_shards = as_int(num_shards, "num_shards", minimum=1)
        self.block = as_int(block, "block", minimum=1)
        if order not in F.MERGE_ORDERS:
            raise ValueError(f"order must be one of {F.MERGE_ORDERS}, got {order!r}")
        self.order = order
        self.inner = get_kernel(inner)

    def __repr__(self) -> str:
        return f"SplitKVKernel(num_shards={self.num_shards}, inner={self.inner!r}, block={self.block})"

    def matmul(self, a, b):
        """The module's projections on the inner kernel's threads: (N, K) @ (K, M) -> (N, M)."""
        return self.inner.matmul(a, b)  # (N, K) @ (K, M): the module's projections on the inner kernel's threads

    def shard_args(self, args: AttentionArgs, keys: np.ndarray, first: bool) -> AttentionArgs:
        """``args`` for the keys ``keys`` only: the mask, bias and keep-mask cut; the sinks on the first shard."""
        keep = args.keep_mask()  # (B, H, Lq, Lk) drawn for every key at once, or None
        return replace(
            args,
            shape=(*args.shape[:3], len(keys)),
            mask=_cut(args.mask, keys, args.shape),
            bias=_cut(args.bias, keys, args.shape),
            keep=_cut(keep, keys, args.shape),
            rng=None,
            sinks=args.sinks if first else None,
            key_index=keys if args.key_index is None else args.key_index[keys],  # the score mods' kv_idx
        )

    def run(self, q, k, v, args: AttentionArgs):
        """Each shard of the keys by the inner kernel, then the exact merge by the shards' lse."""
        keys = [j for j in key_shards(args.shape[3], self.num_shards, self.block) if len(j)] or [np.arange(0)]
        if args.keep is None and args.dropout_p > 0.0:  # one draw for all keys, cut below: as the vectorized kernel
            args = replace(args, keep=args.keep_mask(), rng=None)
        if isinstance(args.mask, StructuredMask):
            args = replace(args, mask=np.asarray(args.mask))  # its entries (b, 1, Lq, Lk), cut per shard
        parts = [
            self.inner.run(q, k[:, :, j], v[:, :, j], self.shard_args(args, j, s == 0)) for s, j in enumerate(keys)
        ]
        (context, lse), merge = F.merge_attention_forward([c for c, _ in parts], [c.lse for _, c in parts], self.order)
        bias_shape = None if args.bias is None else np.shape(args.bias)
        return context, SplitKVCache(self, [c for _, c in parts], keys, merge, lse, args.shape, bias_shape)

    def backward(self, d_context, cache: SplitKVCache, d_lse=None):
        """-> dq, dk, dv, d_bias or None, d_sinks or None: the merge's backward, then each shard's."""
        B, H, Lq, Lk = cache.shape
        contexts = cache.merge[0]
        d_context = check_d_context(d_context, contexts[0].shape, contexts[0].dtype)  # (B, H, Lq, dv)
        d_lse = check_d_lse(d_lse, (B, H, Lq), np.float64)  # (B, H, Lq) or None
        d_contexts, d_lses = F.merge_attention_backward(d_context, cache.merge, d_lse)
        grads = [c.kernel.backward(dc, c, d_lse=dl) for c, dc, dl in zip(cache.parts, d_contexts, d_lses)]
        dq = sum(g[0] for g in grads)  # (B, H, Lq, d): every shard's keys reach every query
        dk = np.empty((B, H, Lk, grads[0][1].shape[-1]), dtype=dq.dtype)  # (B, H, Lk, d)
        dv = np.empty((B, H, Lk, grads[0][2].shape[-1]), dtype=dq.dtype)  # (B, H, Lk, dv)
        for g, keys in zip(grads, cache.keys):
            dk[:, :, keys], dv[:, :, keys] = g[1], g[2]  # a key belongs to one shard
        d_bias = None if cache.bias_shape is None else self._bias_grad([g[3] for g in grads], cache)
        d_params: dict = {}
        for g in grads:  # every shard's share of the score mods' parameters, in order
            add_score_params(d_params, getattr(g, "score_params", {}))
        return AttentionGrads(dq, dk, dv, d_bias, grads[0][4], d_params)  # the sinks joined the first shard

    @staticmethod
    def _bias_grad(parts: list, cache: SplitKVCache) -> np.ndarray:
        """The shards' bias gradients (each the cut bias's shape) -> the bias's: summed when it broadcasts over the
        keys, else each shard's columns in place."""
        shape = cache.bias_shape
        if len(shape) == 0 or shape[-1] == 1:  # the same bias for every key: every shard's gradient adds up
            return sum(parts).reshape(shape)
        full = np.empty((*parts[0].shape[:-1], cache.shape[3]), dtype=parts[0].dtype)  # (b, h, lq, Lk)
        for p, keys in zip(parts, cache.keys):
            full[..., keys] = p
        return full.reshape(shape)
