"""``MultiHeadAttention``: the module that chains the steps of ``functional``.

    query (B, Lq, E)    --linear W_q--> (B, Lq, E) --split_heads--> (B, H, Lq, d) -+
    key   (B, Lk, kdim) --linear W_k--> (B, Lk, E) --split_heads--> (B, H, Lk, d) -+- attention
    value (B, Lk, vdim) --linear W_v--> (B, Lk, E) --split_heads--> (B, H, Lk, d) -+
    output (B, Lq, E) <--linear W_o-- merge_heads <-- context (B, H, Lq, d)

The backward runs the same steps in reverse. Nothing loops over batch or heads in Python.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import functional as F
from . import masks
from . import variants as VAR
from ._checks import as_float_array, check_mask
from .variants import check_variants


@dataclass
class MHACache:
    """Everything ``MultiHeadAttention.backward`` needs, and the named intermediates.

    Q, K, V: (B, H, L, d) the projected inputs after the head split.
    attention: the ``functional.AttentionCache`` (scores, masked_scores, attn_weights, ...).
    context: (B, H, Lq, d) the per-head weighted sums, before the head merge.
    """

    Q: np.ndarray
    K: np.ndarray
    V: np.ndarray
    attention: F.AttentionCache
    context: np.ndarray
    _caches: dict
    impl: str = "vectorized"  # which implementation made this cache (its backward is chosen by it)

    @property
    def attn_weights(self) -> np.ndarray:
        """(B, H, Lq, Lk) attention weights after softmax, before dropout."""
        return self.attention.attn_weights

    @property
    def scores(self) -> np.ndarray:
        """(B, H, Lq, Lk) scaled scores before the mask."""
        return self.attention.scores

    @property
    def dropout_mask(self) -> np.ndarray | None:
        """(B, H, Lq, Lk) bool keep-mask used by dropout, or None."""
        return self.attention.dropout_mask


def _xavier_uniform(rng: np.random.Generator, shape: tuple[int, int], fan_in: int, fan_out: int, dtype):
    bound = np.sqrt(6.0 / (fan_in + fan_out))
    return rng.uniform(-bound, bound, size=shape).astype(dtype)


class MultiHeadAttention:
    """Multi-head attention with a hand-written backward, in the layout of torch.nn.MultiheadAttention.

    embed_dim E, num_heads H (d = E / H); kdim / vdim are the key / value feature sizes (default E).
    ``params`` holds W_q (E, E), W_k (E, kdim), W_v (E, vdim), W_o (E, E) in PyTorch layout
    (y = x Wᵀ + b) and, when ``bias``, b_q, b_k, b_v, b_o (E,).
    Initialization follows PyTorch: xavier-uniform input projections (over the packed (3E, E)
    matrix when kdim == vdim == E), U(±1/sqrt(E)) for W_o, zero biases.
    ``rng`` is an int seed or a numpy Generator; it also drives dropout.
    ``impl`` picks the attention code: "vectorized" (this file, batched over (B, H)), "naive" (a
    Python loop over batch and heads, ``mha_numpy.naive``) or "chunked" (blocked online softmax,
    memory O(L·block), ``mha_numpy.chunked``, which takes ``block_size`` and ``num_threads``, None =
    measured defaults). All three give the same outputs and gradients; the chunked cache computes
    ``attn_weights`` only when it is read.
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        bias: bool = True,
        kdim: int | None = None,
        vdim: int | None = None,
        dropout: float = 0.0,
        dtype=np.float64,
        rng: int | np.random.Generator | None = None,
        impl: str = "vectorized",
        block_size: int | None = None,
        num_threads: int | None = None,
        num_kv_heads: int | None = None,
        rope_theta: float | None = None,
        alibi: bool = False,
    ) -> None:
        kdim = embed_dim if kdim is None else kdim
        vdim = embed_dim if vdim is None else vdim
        for name, value in (("embed_dim", embed_dim), ("kdim", kdim), ("vdim", vdim)):
            if not isinstance(value, (int, np.integer)) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if not isinstance(num_heads, (int, np.integer)) or num_heads <= 0:
            raise ValueError(f"num_heads must be a positive int, got {num_heads!r}")
        if embed_dim % num_heads != 0:
            raise ValueError(f"embed_dim={embed_dim} is not divisible by num_heads={num_heads}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        dtype = np.dtype(dtype)
        if not np.issubdtype(dtype, np.floating):
            raise ValueError(f"dtype must be a floating dtype, got {dtype}")
        F.check_impl(impl, block_size, num_threads)
        num_kv_heads = check_variants(embed_dim, num_heads, num_kv_heads, rope_theta, alibi)

        self.embed_dim, self.num_heads, self.head_dim = embed_dim, num_heads, embed_dim // num_heads
        self.kdim, self.vdim, self.bias, self.dropout, self.dtype = kdim, vdim, bias, dropout, dtype
        self.rng = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
        self.impl, self.block_size, self.num_threads = impl, block_size, num_threads
        self.num_kv_heads, self.rope_theta, self.alibi = num_kv_heads, rope_theta, bool(alibi)

        E, Ekv = embed_dim, num_kv_heads * self.head_dim  # Ekv = E unless grouped-query
        packed = kdim == E and vdim == E and Ekv == E  # torch initialises the packed (3E, E) in_proj_weight
        fan_out = 3 * E if packed else E
        self.params: dict[str, np.ndarray] = {
            "W_q": _xavier_uniform(self.rng, (E, E), E, fan_out, dtype),
            "W_k": _xavier_uniform(self.rng, (Ekv, kdim), kdim, fan_out, dtype),
            "W_v": _xavier_uniform(self.rng, (Ekv, vdim), vdim, fan_out, dtype),
            "W_o": self.rng.uniform(-1 / np.sqrt(E), 1 / np.sqrt(E), size=(E, E)).astype(dtype),
        }
        if bias:
            for name, size in (("b_q", E), ("b_k", Ekv), ("b_v", Ekv), ("b_o", E)):
                self.params[name] = np.zeros(size, dtype=dtype)

    def __repr__(self) -> str:
        return (
            f"MultiHeadAttention(embed_dim={self.embed_dim}, num_heads={self.num_heads}, bias={self.bias}, "
            f"kdim={self.kdim}, vdim={self.vdim}, dropout={self.dropout}, dtype={self.dtype.name}"
            + ("" if self.impl == "vectorized" else f", impl={self.impl!r}")
            + ("" if self.num_kv_heads == self.num_heads else f", num_kv_heads={self.num_kv_heads}")
            + ("" if self.rope_theta is None else f", rope_theta={self.rope_theta:g}")
            + (", alibi=True" if self.alibi else "")
            + ")"
        )

    # ------------------------------------------------------------------ checks

    def _check_inputs(self, query, key, value, mask, positions=None, kv_cache=None):
        query = as_float_array(query, "query", ndim=3)
        key = as_float_array(key, "key", ndim=3)
        value = as_float_array(value, "value", ndim=3)
        for name, x, size in (("query", query, self.embed_dim), ("key", key, self.kdim), ("value", value, self.vdim)):
            if x.shape[-1] != size:
                what = "embed_dim" if name == "query" else ("kdim" if name == "key" else "vdim")
                raise ValueError(f"{name} with shape {x.shape}: last dim must be {what}={size}")
            if x.dtype != self.dtype:
                raise ValueError(
                    f"{name} has dtype {x.dtype} (shape {x.shape}) but the parameters are {self.dtype}; "
                    f"convert with .astype(np.{self.dtype.name}) or build the module with dtype=np.{x.dtype.name}"
                )
        if not query.shape[0] == key.shape[0] == value.shape[0]:
            raise ValueError(f"batch sizes differ: query {query.shape}, key {key.shape}, value {value.shape}")
        if key.shape[1] != value.shape[1]:
            raise ValueError(f"key and value lengths differ: key {key.shape}, value {value.shape}")
        B, Lq, Lk = query.shape[0], query.shape[1], key.shape[1]
        Lk_all = VAR.check_call(self, B, Lq, Lk, positions, kv_cache)  # cached + new keys
        mask = check_mask(mask, (B, self.num_heads, Lq, Lk_all))
        return query, key, value, mask

    # ------------------------------------------------------------------ forward / backward

    def forward(
        self,
        query: np.ndarray,
        key: np.ndarray,
        value: np.ndarray,
        mask: np.ndarray | None = None,
        training: bool = False,
        dropout_mask: np.ndarray | None = None,
        positions: np.ndarray | None = None,
        kv_cache=None,
    ) -> tuple[np.ndarray, MHACache]:
        """query (B, Lq, E), key (B, Lk, kdim), value (B, Lk, vdim) -> output (B, Lq, E), cache.

        mask: bool (True = may attend) or float (added), broadcastable to (B, H, Lq, Lk).
        training: apply dropout to the attention weights (when ``dropout`` > 0).
        dropout_mask: optional bool keep-mask (B, H, Lq, Lk) used instead of sampling.
        """
        query, key, value, mask = self._check_inputs(query, key, value, mask, positions, kv_cache)
        P, H, Hkv = self.params, self.num_heads, self.num_kv_heads
        p_drop = self.dropout if training else 0.0
        if dropout_mask is not None and not training:
            raise ValueError("dropout_mask is only used with training=True")
        plain = Hkv == H and self.rope_theta is None and not self.alibi and kv_cache is None
        if self.impl != "vectorized" and plain:
            return F.impl_module(self.impl).mha_forward(self, query, key, value, mask, p_drop, dropout_mask)
        Lq, Lk, offset = query.shape[1], key.shape[1], 0 if kv_cache is None else len(kv_cache)
        pos_q, pos_k = VAR.positions_of(positions, Lq, Lk, offset)

        q, c_q = F.linear_forward(query, P["W_q"], P.get("b_q"))  # (B, Lq, E)
        k, c_k = F.linear_forward(key, P["W_k"], P.get("b_k"))  # (B, Lk, Ekv)
        v, c_v = F.linear_forward(value, P["W_v"], P.get("b_v"))  # (B, Lk, Ekv)
        Q, c_sq = F.split_heads_forward(q, H)  # (B, H, Lq, d)
        K, c_sk = F.split_heads_forward(k, Hkv)  # (B, Hkv, Lk, d)
        V, c_sv = F.split_heads_forward(v, Hkv)  # (B, Hkv, Lk, d)
        Q, c_rq = VAR.rope_step(self, Q, pos_q)  # (B, H, Lq, d) rotated when rope_theta is set
        K, c_rk = VAR.rope_step(self, K, pos_k)  # (B, Hkv, Lk, d)
        K, V, mask, _ = VAR.cache_step(kv_cache, K, V, mask)  # (B, Hkv, Lk_all, d) with a KV cache
        K_rep, c_gk = F.repeat_kv_forward(K, H // Hkv)  # (B, H, Lk_all, d)
        V_rep, c_gv = F.repeat_kv_forward(V, H // Hkv)  # (B, H, Lk_all, d)
        mask = masks.combine_masks(mask, VAR.alibi_step(self, Lq, K.shape[2]))  # + ALiBi bias when alibi
        context, c_att = F.scaled_dot_product_attention_forward(
            Q, K_rep, V_rep, mask, dropout_p=p_drop, rng=self.rng, dropout_mask=dropout_mask, **self._kernel_args()
        )  # (B, H, Lq, d)
        merged, c_m = F.merge_heads_forward(context)  # (B, Lq, E)
        output, c_o = F.linear_forward(merged, P["W_o"], P.get("b_o"))  # (B, Lq, E)

        caches = dict(q=c_q, k=c_k, v=c_v, sq=c_sq, sk=c_sk, sv=c_sv, rq=c_rq, rk=c_rk, gk=c_gk, gv=c_gv, m=c_m, o=c_o)
        caches["kv_cache"] = kv_cache is not None
        return output, MHACache(Q=Q, K=K, V=V, attention=c_att, context=context, _caches=caches)

    def _kernel_args(self) -> dict:
        if self.impl == "chunked":
            return dict(impl="chunked", block_size=self.block_size, num_threads=self.num_threads)
        return dict(impl=self.impl)

    __call__ = forward

    def backward(self, d_output: np.ndarray, cache: MHACache) -> dict[str, np.ndarray]:
        """d_output (B, Lq, E) -> dict of gradients.

        Keys: "query" (B, Lq, E), "key" (B, Lk, kdim), "value" (B, Lk, vdim), and one per
        ``params`` key with that parameter's shape. For self-attention (the same array passed
        as query, key and value) its gradient is grads["query"] + grads["key"] + grads["value"].
        """
        c = cache._caches
        d_output = as_float_array(d_output, "d_output", ndim=3)
        expected = (cache.context.shape[0], cache.context.shape[2], self.embed_dim)  # (B, Lq, E)
        if d_output.shape != expected:
            raise ValueError(f"d_output has shape {d_output.shape}, expected {expected} like the output")
        if cache.impl != "vectorized":
            return F.impl_module(cache.impl).mha_backward(self, d_output, cache)
        if c.get("kv_cache"):
            raise ValueError(
                "backward through a call with kv_cache is not supported: the cache is state (forward only)"
            )

        g: dict[str, np.ndarray] = {}
        d_merged, g["W_o"], db_o = F.linear_backward(d_output, c["o"])  # (B, Lq, E)
        d_context = F.merge_heads_backward(d_merged, c["m"])  # (B, H, Lq, d)
        dQ, dK, dV = F.scaled_dot_product_attention_backward(d_context, cache.attention)  # (B, H, L, d)
        dK = F.repeat_kv_backward(dK, c["gk"])  # (B, Hkv, Lk, d): sum over each group
        dV = F.repeat_kv_backward(dV, c["gv"])  # (B, Hkv, Lk, d)
        dK = VAR.rope_step_backward(dK, c["rk"])  # (B, Hkv, Lk, d)
        dQ = VAR.rope_step_backward(dQ, c["rq"])  # (B, H, Lq, d)
        dq = F.split_heads_backward(dQ, c["sq"])  # (B, Lq, E)
        dk = F.split_heads_backward(dK, c["sk"])  # (B, Lk, Ekv)
        dv = F.split_heads_backward(dV, c["sv"])  # (B, Lk, Ekv)
        g["query"], g["W_q"], db_q = F.linear_backward(dq, c["q"])  # (B, Lq, E)
        g["key"], g["W_k"], db_k = F.linear_backward(dk, c["k"])  # (B, Lk, kdim)
        g["value"], g["W_v"], db_v = F.linear_backward(dv, c["v"])  # (B, Lk, vdim)
        if self.bias:
            g.update(b_q=db_q, b_k=db_k, b_v=db_v, b_o=db_o)
        return g
