"""``MultiHeadAttention``: the module that chains the steps of ``functional``.

    query (B, Lq, E)    --linear W_q--> (B, Lq, E) --split_heads--> (B, H, Lq, d) -+
    key   (B, Lk, kdim) --linear W_k--> (B, Lk, E) --split_heads--> (B, H, Lk, d) -+- attention
    value (B, Lk, vdim) --linear W_v--> (B, Lk, E) --split_heads--> (B, H, Lk, d) -+
    output (B, Lq, E) <--linear W_o-- merge_heads <-- context (B, H, Lq, d)

Today's optional steps (``mha_numpy.variants`` decides which a call needs): grouped-query heads
(K, V with num_kv_heads heads, ``repeat_kv`` before the kernel), RoPE on Q and K after the split,
a KV cache appended before ``repeat_kv``, ALiBi as the kernel's score bias.

The backward runs the same steps in reverse. The attention in the middle is a kernel
(``mha_numpy.kernels``): the module owns everything around it, once, for every kernel.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from . import functional as F
from . import recompute as RC
from . import variants as VAR
from ._checks import FLOAT_DTYPES, as_float_array, as_generator, check_probability
from .kernels import check_args, get_kernel


@dataclass
class MHACache:
    """Everything ``MultiHeadAttention.backward`` needs, and the named intermediates (public).

    Q: (B, H, Lq, d), K, V: (B, Hkv, Lk, d) the projected inputs after the head split and RoPE, before
        ``repeat_kv`` (Hkv = num_kv_heads); with a KV cache, K and V hold every cached position.
    attention: the kernel's cache (``attn_weights``, ``scores``, ``kernel``, ...).
    context: (B, H, Lq, d) the per-head weighted sums, before the head merge.
    steps: each step's cache by name, in forward order: "qkv_proj" (self-attention: one GEMM) or
        "q_proj", "k_proj", "v_proj"; "q_split", "k_split", "v_split"; "q_rope", "k_rope" (rope_theta);
        "kv_cache" (the number of positions cached before the call); "k_repeat", "v_repeat" (grouped-query);
        "rel_bias" (when the module has one); "merge"; "out_proj". Each is the cache of the ``functional``
        pair of that name's kind.
    owner: the module that made the cache; ``backward`` refuses a cache of another module.
    """

    Q: np.ndarray
    K: np.ndarray
    V: np.ndarray
    attention: object
    context: np.ndarray
    steps: dict
    owner: object = None

    @property
    def attn_weights(self) -> np.ndarray:
        """(B, H, Lq, Lk) attention weights after softmax, before dropout."""
        return self.attention.attn_weights

    @property
    def scores(self) -> np.ndarray:
        """(B, H, Lq, Lk) scaled scores (plus any bias) before the mask."""
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
    ``impl`` picks the kernel (``mha_numpy.kernels``): "vectorized" (batched over (B, H)), "naive" (a
    Python loop over batch and heads), "chunked" (blocked online softmax, memory O(L·block); takes
    ``block_size`` and ``num_threads``, None = measured defaults), or a kernel object. All give the same
    outputs and gradients. ``rel_pos_max_distance`` R adds a learned bias per head and clipped distance
    j - i to the scores (T5-style), ``params["rel_bias"]`` (H, 2R + 1).

    Today's variants (``docs/derivation.md`` § 14): ``num_kv_heads`` Hkv (None = H) key/value heads for grouped-query
    (1 = multi-query) attention, W_k (Hkv·d, kdim), W_v (Hkv·d, vdim), b_k, b_v (Hkv·d,), query head h reading
    key/value head h // (H / Hkv); ``rope_theta`` rotates Q and K per head (RoPE, Hugging Face Llama convention,
    positions 0, 1, ... or ``forward(..., positions=)``); ``alibi=True`` adds ALiBi's distance penalty to the scores.
    ``forward(..., kv_cache=KVCache())`` decodes incrementally (forward only).

    ``recompute=True`` trades one more forward of the projections and the kernel for memory (activation
    checkpointing, ``mha_numpy/recompute.py``): forward and backward run one key/value head and its query heads
    at a time (one head without grouped-query attention), the cache keeps only the inputs, and the backward
    recomputes each group's Q, K, V and context. Same outputs and gradients (to rounding); sampled dropout draws
    its own keep-masks per group (``cache.dropout_mask`` shows them); no ``kv_cache``. With the chunked kernel,
    memory is then a few (L, d) arrays beyond the inputs, outputs and gradients.
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
        impl="vectorized",
        block_size: int | None = None,
        num_threads: int | None = None,
        rel_pos_max_distance: int | None = None,
        num_kv_heads: int | None = None,
        rope_theta: float | None = None,
        alibi: bool = False,
        recompute: bool = False,
    ) -> None:
        kdim = embed_dim if kdim is None else kdim
        vdim = embed_dim if vdim is None else vdim
        for name, value in (("embed_dim", embed_dim), ("num_heads", num_heads), ("kdim", kdim), ("vdim", vdim)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if embed_dim % num_heads != 0:
            raise ValueError(f"embed_dim={embed_dim} is not divisible by num_heads={num_heads}")
        R = rel_pos_max_distance
        if R is not None and (isinstance(R, bool) or not isinstance(R, (int, np.integer)) or R < 0):
            raise ValueError(f"rel_pos_max_distance must be a non-negative int or None, got {R!r}")
        check_probability(dropout, "dropout")
        try:
            dtype = np.dtype(dtype)
        except TypeError:
            raise ValueError(f"dtype must be np.float32 or np.float64, got {dtype!r}") from None
        if dtype not in FLOAT_DTYPES:
            raise ValueError(f"dtype must be np.float32 or np.float64, got {dtype}")
        num_kv_heads = VAR.check_variants(embed_dim, num_heads, num_kv_heads, rope_theta, alibi)
        if not isinstance(recompute, (bool, np.bool_)):
            raise ValueError(f"recompute must be True or False, got {recompute!r}")
        self.kernel = get_kernel(impl, block_size=block_size, num_threads=num_threads)
        self.impl = self.kernel.name

        self.embed_dim, self.num_heads, self.head_dim = embed_dim, num_heads, embed_dim // num_heads
        self.kdim, self.vdim, self.bias, self.dropout, self.dtype = kdim, vdim, bias, float(dropout), dtype
        self.rng = as_generator(rng)
        self.num_kv_heads, self.rope_theta, self.alibi = num_kv_heads, rope_theta, bool(alibi)
        self.recompute = bool(recompute)

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
        if R is not None:
            self.params["rel_bias"] = self.rng.normal(0.0, 1.0, size=(num_heads, 2 * R + 1)).astype(dtype)

    def __repr__(self) -> str:
        return (
            f"MultiHeadAttention(embed_dim={self.embed_dim}, num_heads={self.num_heads}, bias={self.bias}, "
            f"kdim={self.kdim}, vdim={self.vdim}, dropout={self.dropout}, dtype={self.dtype.name}"
            + ("" if self.impl == "vectorized" else f", impl={self.kernel!r}")
            + ("" if self.num_kv_heads == self.num_heads else f", num_kv_heads={self.num_kv_heads}")
            + ("" if self.rope_theta is None else f", rope_theta={self.rope_theta:g}")
            + (", alibi=True" if self.alibi else "")
            + (", recompute=True" if self.recompute else "")
            + ")"
        )

    # ------------------------------------------------------------------ checks

    def _check_inputs(self, query, key, value):
        query = as_float_array(query, "query", ndim=3)
        key = as_float_array(key, "key", ndim=3)
        value = as_float_array(value, "value", ndim=3)
        for name, x, size, what in (
            ("query", query, self.embed_dim, "embed_dim"),
            ("key", key, self.kdim, "kdim"),
            ("value", value, self.vdim, "vdim"),
        ):
            if x.shape[-1] != size:
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
        return query, key, value

    def _check_cache(self, d_output, cache) -> np.ndarray:
        if not isinstance(cache, (MHACache, RC.RecomputeCache)):
            raise ValueError(
                f"cache must be the MHACache returned by this module's forward, got {type(cache).__name__}"
            )
        if cache.owner is not self:
            raise ValueError("cache was made by another MultiHeadAttention: pass the cache of this module's forward")
        if isinstance(cache, MHACache) and "kv_cache" in cache.steps:
            raise ValueError(
                "backward through a call with kv_cache is not supported: the cache is state (forward only)"
            )
        d_output = as_float_array(d_output, "d_output", ndim=3)
        if isinstance(cache, RC.RecomputeCache):
            B, Lq = cache.query.shape[:2]  # query (B, Lq, E)
        else:
            B, Lq = cache.context.shape[0], cache.context.shape[2]  # context (B, H, Lq, d)
        expected = (B, Lq, self.embed_dim)
        if d_output.shape != expected or d_output.dtype != self.dtype:
            raise ValueError(
                f"d_output has shape {d_output.shape} and dtype {d_output.dtype}; expected {expected} and "
                f"{self.dtype} like the output"
            )
        return d_output

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
        positions: RoPE positions of the tokens, (L,) or (B, L) (self-attention); default 0, 1, ... (after a
            KV cache: its length, length + 1, ...).
        kv_cache: a ``KVCache`` (self-attention, forward only): the call's keys and values are appended and the
            queries attend to every cached position, causally within the call; Lk above counts them all.
        """
        query, key, value = self._check_inputs(query, key, value)
        if dropout_mask is not None and not training:
            raise ValueError("dropout_mask is only used with training=True")
        P, H, Hkv = self.params, self.num_heads, self.num_kv_heads
        B, Lq, Lk = query.shape[0], query.shape[1], key.shape[1]
        p_drop = self.dropout if training else 0.0
        if self.recompute and kv_cache is not None:
            raise ValueError(
                "kv_cache with recompute=True is not supported: decoding keeps K and V, recompute does not"
            )
        Lk_all = VAR.check_call(self, B, Lq, Lk, positions, kv_cache)  # + cached positions; before arithmetic
        args = check_args(
            (B, H, Lq, Lk_all), self.head_dim, mask, None, p_drop, self.rng, dropout_mask
        )  # before arithmetic
        pos_q, pos_k = VAR.positions_of(positions, Lq, Lk, 0 if kv_cache is None else len(kv_cache))
        if self.recompute:  # head group by head group, keeping only the inputs (recompute.py)
            return RC.forward(self, query, key, value, args, (pos_q, pos_k))
        kernel = self.kernel.choose(args.shape)  # the kernel of this call (``auto`` picks one by the shape)
        mm = kernel.matmul  # the projections' products run on the kernel's threads (mha_numpy/threads.py)
        s: dict = {}  # each step's cache, by name

        if query is key is value and self.kdim == self.vdim == self.embed_dim:  # self-attention: one GEMM
            biases = [P["b_q"], P["b_k"], P["b_v"]] if self.bias else None
            (q, k, v), s["qkv_proj"] = F.fused_linear_forward(query, [P["W_q"], P["W_k"], P["W_v"]], biases, mm)
        else:
            q, s["q_proj"] = F.linear_forward(query, P["W_q"], P.get("b_q"), mm)  # (B, Lq, E)
            k, s["k_proj"] = F.linear_forward(key, P["W_k"], P.get("b_k"), mm)  # (B, Lk, Ekv), Ekv = Hkv·d
            v, s["v_proj"] = F.linear_forward(value, P["W_v"], P.get("b_v"), mm)  # (B, Lk, Ekv)
        Q, s["q_split"] = F.split_heads_forward(q, H)  # (B, H, Lq, d)
        K, s["k_split"] = F.split_heads_forward(k, Hkv)  # (B, Hkv, Lk, d)
        V, s["v_split"] = F.split_heads_forward(v, Hkv)  # (B, Hkv, Lk, d)
        if self.rope_theta is not None:  # rotary positions: turn each feature pair by its position's angle
            Q, s["q_rope"] = F.rope_forward(Q, pos_q, self.rope_theta)  # (B, H, Lq, d)
            K, s["k_rope"] = F.rope_forward(K, pos_k, self.rope_theta)  # (B, Hkv, Lk, d)
        if kv_cache is not None:  # forward only: append, attend to every cached position
            K, V, args, s["kv_cache"] = VAR.cache_step(kv_cache, K, V, args)  # (B, Hkv, Lk_all, d)
        K_heads, V_heads = K, V  # the cache's K, V: Hkv heads
        if Hkv != H:  # grouped-query: query head h reads key/value head h // (H / Hkv)
            K_heads, s["k_repeat"] = F.repeat_kv_forward(K, H // Hkv)  # (B, H, Lk_all, d)
            V_heads, s["v_repeat"] = F.repeat_kv_forward(V, H // Hkv)  # (B, H, Lk_all, d)
        if "rel_bias" in P:  # a learned bias per head and distance, added to the scores
            bias, s["rel_bias"] = F.relative_position_bias_forward(P["rel_bias"], Lq, Lk)  # (1, H, Lq, Lk)
            args = replace(args, bias=bias)
        if self.alibi:  # ALiBi: a fixed distance penalty per head, added to the scores
            args = VAR.with_alibi(args, self.dtype)  # bias (1, H, Lq, Lk_all), no gradient
        context, attention = kernel.run(Q, K_heads, V_heads, args)  # (B, H, Lq, d)
        merged, s["merge"] = F.merge_heads_forward(context)  # (B, Lq, E)
        output, s["out_proj"] = F.linear_forward(merged, P["W_o"], P.get("b_o"), mm)  # (B, Lq, E)
        return output, MHACache(Q, K, V, attention, context, s, owner=self)

    __call__ = forward

    def backward(self, d_output: np.ndarray, cache: MHACache) -> dict[str, np.ndarray]:
        """d_output (B, Lq, E) -> dict of gradients.

        Keys: "query" (B, Lq, E), "key" (B, Lk, kdim), "value" (B, Lk, vdim), and one per
        ``params`` key with that parameter's shape. For self-attention (the same array passed
        as query, key and value) its gradient is grads["query"] + grads["key"] + grads["value"].
        """
        d_output = self._check_cache(d_output, cache)
        if isinstance(cache, RC.RecomputeCache):  # recompute each head group's forward, then its backward
            return RC.backward(self, d_output, cache)
        s, g, kernel = cache.steps, {}, cache.attention.kernel  # the kernel that ran the forward
        d_merged, g["W_o"], g["b_o"] = F.linear_backward(d_output, s["out_proj"], kernel.matmul)  # (B, Lq, E)
        d_context = F.merge_heads_backward(d_merged, s["merge"])  # (B, H, Lq, d)
        dQ, dK, dV, d_bias = kernel.backward(d_context, cache.attention)  # (B, H, L, d)
        if "rel_bias" in s:  # (with ALiBi too: ALiBi's part of d_bias is the same, the table's gradient)
            g["rel_bias"] = F.relative_position_bias_backward(d_bias, s["rel_bias"])  # (H, 2R + 1)
        if "k_repeat" in s:
            dK = F.repeat_kv_backward(dK, s["k_repeat"])  # (B, Hkv, Lk, d): the sum over each group
            dV = F.repeat_kv_backward(dV, s["v_repeat"])  # (B, Hkv, Lk, d)
        if "q_rope" in s:
            dK = F.rope_backward(dK, s["k_rope"])  # (B, Hkv, Lk, d): the inverse rotation
            dQ = F.rope_backward(dQ, s["q_rope"])  # (B, H, Lq, d)
        dq = F.split_heads_backward(dQ, s["q_split"])  # (B, Lq, E)
        dk = F.split_heads_backward(dK, s["k_split"])  # (B, Lk, Ekv)
        dv = F.split_heads_backward(dV, s["v_split"])  # (B, Lk, Ekv)
        if "qkv_proj" in s:
            (g["query"], g["key"], g["value"]), dWs, dbs = F.fused_linear_backward(
                [dq, dk, dv], s["qkv_proj"], kernel.matmul
            )
            g["W_q"], g["W_k"], g["W_v"] = dWs
            g["b_q"], g["b_k"], g["b_v"] = dbs if dbs is not None else (None, None, None)
        else:
            g["query"], g["W_q"], g["b_q"] = F.linear_backward(dq, s["q_proj"], kernel.matmul)  # (B, Lq, E)
            g["key"], g["W_k"], g["b_k"] = F.linear_backward(dk, s["k_proj"], kernel.matmul)  # (B, Lk, kdim)
            g["value"], g["W_v"], g["b_v"] = F.linear_backward(dv, s["v_proj"], kernel.matmul)  # (B, Lk, vdim)
        return {name: g[name] for name in ("query", "key", "value", *self.params)}
