"""The optional steps of today's attention, as ``MultiHeadAttention`` uses them: argument checks, the positions of
a call, the KV-cache step and the ALiBi bias. The maths is in ``functional`` (``repeat_kv``, ``rope``,
``alibi_bias``) and ``kv_cache``; this module only decides which of it a call needs.

    Q (B, H, Lq, d) ─[rope at positions]────────────────────────────────────┐
    K (B, Hkv, Lk, d) ─[rope]─[append to the KV cache]─repeat_kv─► (B, H, Lk_all, d) ─┤ kernel (+ ALiBi bias)
    V (B, Hkv, Lk, d) ────────[append to the KV cache]─repeat_kv─► (B, H, Lk_all, d) ─┘
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from . import functional as F
from . import masks
from .kernels import AttentionArgs
from .kv_cache import KVCache


def check_variants(embed_dim: int, num_heads: int, num_kv_heads, rope_theta, alibi) -> int:
    """Validate the constructor's variant arguments (ValueError naming each); -> num_kv_heads (None -> num_heads)."""
    if num_kv_heads is None:
        num_kv_heads = num_heads
    if isinstance(num_kv_heads, bool) or not isinstance(num_kv_heads, (int, np.integer)) or num_kv_heads <= 0:
        raise ValueError(f"num_kv_heads must be a positive int or None, got {num_kv_heads!r}")
    if num_heads % num_kv_heads:
        raise ValueError(
            f"num_heads={num_heads} is not a multiple of num_kv_heads={num_kv_heads}: each key/value head serves "
            "num_heads // num_kv_heads query heads"
        )
    if rope_theta is not None:
        if isinstance(rope_theta, bool) or not isinstance(rope_theta, (int, float, np.integer, np.floating)):
            raise ValueError(f"rope_theta must be a positive number or None, got {rope_theta!r}")
        if not rope_theta > 0:
            raise ValueError(f"rope_theta must be a positive number or None, got {rope_theta!r}")
        if (embed_dim // num_heads) % 2:
            raise ValueError(
                f"rope_theta needs an even head dim (RoPE turns pairs of features): "
                f"embed_dim={embed_dim} / num_heads={num_heads} = {embed_dim // num_heads}"
            )
    if not isinstance(alibi, (bool, np.bool_)):
        raise ValueError(f"alibi must be True or False, got {alibi!r}")
    return int(num_kv_heads)


def check_call(module, B: int, Lq: int, Lk: int, positions, kv_cache) -> int:
    """Validate ``positions`` and ``kv_cache`` of one forward before any arithmetic; -> Lk_all (cached + new keys)."""
    cached = 0
    if kv_cache is not None:
        if not isinstance(kv_cache, KVCache):
            raise ValueError(
                f"kv_cache must be a KVCache (from mha_numpy import KVCache), got {type(kv_cache).__name__}"
            )
        if Lq != Lk:
            raise ValueError(f"kv_cache is for self-attention: query length {Lq} and key length {Lk} must be equal")
        if "rel_bias" in module.params:
            raise ValueError("kv_cache with rel_pos_max_distance is not supported: the table's bias is per call")
        kv_cache.bind(module, B)
        cached = len(kv_cache)
    if positions is not None:
        if module.rope_theta is None:
            raise ValueError("positions= rotates queries and keys: it needs a module with rope_theta set")
        if Lq != Lk:
            raise ValueError(f"positions= is for self-attention: query length {Lq} and key length {Lk} differ")
        F.check_positions(positions, B, Lq)
    return cached + Lk


def positions_of(positions, Lq: int, Lk: int, offset: int):
    """-> (query positions, key positions) of this call: the given ones for both, else offset + 0, 1, ..."""
    if positions is not None:
        return positions, positions
    return np.arange(offset, offset + Lq), np.arange(offset, offset + Lk)


def cache_step(kv_cache: KVCache, K: np.ndarray, V: np.ndarray, args: AttentionArgs):
    """Append K, V (B, Hkv, Lq, ·) to the cache; the call's queries attend causally to every cached position.

    -> (keys, values) (B, Hkv, Lk_all, ·), args with the causal mask (bottom-right aligned) combined into its mask,
    and the number of positions cached before the call.
    """
    offset = len(kv_cache)
    keys, values = kv_cache.append(K, V)
    causal = masks.causal_mask(K.shape[2], keys.shape[2], diagonal=offset)  # (Lq, Lk_all)
    return keys, values, replace(args, mask=masks.combine_masks(args.mask, causal)), offset


def with_alibi(args: AttentionArgs, dtype) -> AttentionArgs:
    """args with ALiBi's (1, H, Lq, Lk) bias added to its bias (queries at the last Lq of the Lk positions)."""
    _, H, Lq, Lk = args.shape
    alibi = F.alibi_bias(H, Lq, Lk, offset=Lk - Lq, dtype=dtype)  # (1, H, Lq, Lk)
    return replace(args, bias=alibi if args.bias is None else args.bias + alibi)
