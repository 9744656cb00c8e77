"""``MultiHeadLatentAttention``: DeepSeek's multi-head latent attention (MLA), a second module on the same data path
machinery: its own projection steps (``latent_steps``), ``steps.py``'s kernel, merge and output steps, walked
forwards and backwards by ``flow``, every kernel, ``recompute=True`` and a latent KV cache (``LatentCache``).

    query (B, Lq, E) --W_q or W_qa, norm, W_qb--> q (B, Lq, H·dqk) --split, RoPE on the rope part--> Q (B, H, Lq, dqk)
    key   (B, Lk, E) --W_kva--> [c_kv (B, Lk, r) --norm-- | k_rope (B, 1, Lk, dr) --RoPE--]
                     c_kv --W_kvb--> [K_nope (B, H, Lk, dn) | V (B, H, Lk, dv)],  K = [K_nope | k_rope]
    output (B, Lq, E) <--W_o-- merge (B, Lq, H·dv) <-- context = softmax(Q Kᵀ · scale + mask) V (the kernel)

``print(mla.describe())`` shows the steps; docs/derivation.md § 25 derives each one and its backward.
"""

from __future__ import annotations

import numpy as np

from .attention import MultiHeadAttention


class MultiHeadLatentAttention(MultiHeadAttention):
    """Multi-head latent attention (DeepSeek-V2, V3) with a hand-written backward, in Hugging Face's weight layout:
    ``MultiHeadAttention`` with ``kv_lora_rank`` set, under the name users know (no forward or backward of its own).

    embed_dim E, num_heads H, kv_lora_rank r, qk_rope_head_dim dr, qk_nope_head_dim dn, v_head_dim dv (the query and
    key heads are dqk = dn + dr wide, the value heads dv). ``params``: W_q (H·dqk, E), or with ``q_lora_rank`` rq
    W_qa (rq, E), q_a_norm (rq,), W_qb (H·dqk, rq); W_kva (r + dr, E), kv_a_norm (r,), W_kvb (H·(dn + dv), r);
    W_o (E, H·dv); with ``bias`` b_qa, b_kva, b_o. Linear weights U(±1/√fan_in) as torch's nn.Linear, norms 1.
    Defaults as DeepSeek's: bias=False, rope_theta=10000, rope_interleave=True (pairs (0, 1), (2, 3), ...),
    norm_eps=1e-6. Every other option of ``MultiHeadAttention`` that makes sense here works the same way
    (``recompute``, ``memory_budget``, ``softcap``, ``sinks``, ``alibi``, ``head_temperature``, masks, ``kv_cache=``
    a ``LatentCache`` or a ``StreamingKVCache``); the rest are refused naming both options.

    ``forward(query, key=None, ...)``: self-attention when ``key`` is None, as DeepSeek uses it; a ``key`` gives the
    tokens the latent is made from (Lk may differ from Lq); the values come from the latent (no ``value``).
    Causality is not part of the module: pass ``masks.causal_mask(L)`` (a cache makes each call causal).
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        kv_lora_rank: int,
        qk_rope_head_dim: int,
        qk_nope_head_dim: int,
        v_head_dim: int,
        q_lora_rank: int | None = None,
        bias: bool = False,
        dropout: float = 0.0,
        dtype=np.float64,
        rng: int | np.random.Generator | None = None,
        impl="vectorized",
        block_size: int | None = None,
        num_threads: int | None = None,
        rope_theta: float = 10000.0,
        **options,
    ) -> None:
        sizes = dict(kv_lora_rank=kv_lora_rank, qk_rope_head_dim=qk_rope_head_dim, qk_nope_head_dim=qk_nope_head_dim,
                     v_head_dim=v_head_dim, q_lora_rank=q_lora_rank)  # fmt: skip
        kw = dict(bias=bias, dropout=dropout, dtype=dtype, rng=rng, impl=impl, block_size=block_size)
        super().__init__(embed_dim, num_heads, num_threads=num_threads, rope_theta=rope_theta, **kw, **sizes, **options)
