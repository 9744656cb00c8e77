"""Interchangeable ways to compute the same attention on (B, H, L, d) arrays, and the one registry.

    vectorized  ``functional``'s pairs batched over (B, H): the whole (B, H, Lq, Lk) score tensor
    naive       the same pairs one (batch item, head) at a time: the formula read literally
    chunked     blocked online softmax (FlashAttention-style) on a thread pool: memory O(L · block)
    auto        one of the two above per call, by a documented rule on the shape (``auto.py``)

and, not registered (it wraps one of them, ``SplitKVKernel(num_shards, inner)``; tests/test_split_kv.py checks it):

    split_kv    another kernel on S shards of the keys, merged exactly by their lse (split-KV decoding, ``split_kv.py``)

The protocol (``base.Kernel``): ``forward(q, k, v, mask=None, scale=None, dropout_p=0.0, rng=None,
dropout_mask=None, bias=None, score_mods=(), sinks=None) -> (context, cache)`` and ``backward(d_context, cache,
d_lse=None) -> (dq, dk, dv, d_bias, d_sinks)``; the cache carries its kernel and exposes ``attn_weights`` and each
row's log-sum-exp ``lse``. ``get_kernel`` (``registry.py``) is the only place a name is resolved:
``MultiHeadAttention(impl=...)`` takes a registered name or a kernel object. A new kernel is one file here and one
``register`` call in ``registry.py``; the conformance tests pick it up from ``KERNELS``.
"""

from __future__ import annotations

from .auto import AutoKernel
from .base import CACHE_ATTRIBUTES, AttentionArgs, Kernel, ScoreMod, check_args
from .chunked import ChunkedKernel
from .naive import NaiveKernel
from .registry import KERNELS, get_kernel, register
from .split_kv import SplitKVKernel
from .vectorized import VectorizedKernel

__all__ = ["AttentionArgs", "Kernel", "KERNELS", "register", "get_kernel", "check_args", "ScoreMod", "CACHE_ATTRIBUTES"]
__all__ += ["VectorizedKernel", "NaiveKernel", "ChunkedKernel", "AutoKernel", "SplitKVKernel"]
