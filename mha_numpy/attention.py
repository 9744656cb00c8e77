"""``MultiHeadAttention``: one module whose data path is a list of steps (``mha_numpy.steps``), walked forwards and
backwards (``mha_numpy.flow``), around one interchangeable kernel (``mha_numpy.kernels``).

    query (B, Lq, E)    --linear W_q--> (B, Lq, E) --split_heads--> (B, H, Lq, d) -+
    key   (B, Lk, kdim) --linear W_k--> (B, Lk, E) --split_heads--> (B, H, Lk, d) -+- attention (the kernel)
    value (B, Lk, vdim) --linear W_v--> (B, Lk, E) --split_heads--> (B, H, Lk, d) -+
    output (B, Lq, E) <--linear W_o-- merge_heads <-- context (B, H, Lq, d)

The module owns the parameters and the call's boundary: every argument is checked here, once, before any
arithmetic; the steps below then compute without checking again. ``mha.steps`` is the list of a call's steps and
``print(mha.describe())`` shows it; ``steps.build_steps`` is where the options become that list.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import flow, latent_steps  # noqa: F401  (latent_steps: its steps and options join the registries)
from ._checks import as_float_array, as_generator
from .flow import Flow, RecomputeCache
from .kernels import check_args, get_kernel
from .steps import OPTIONS, AttentionConfig, build_steps, describe


@dataclass
class MHACache:
    """Everything ``MultiHeadAttention.backward`` needs, and the named intermediates (public).

    Q: (B, H, Lq, d), K, V: (B, Hkv, Lk, d) the projected inputs after the head split and RoPE, before
        ``repeat_kv`` (Hkv = num_kv_heads); with a KV cache, K and V hold every cached position (and the keys
        ``add_bias_kv`` / ``add_zero_attn`` append, at the end).
    attention: the kernel's cache (``attn_weights``, ``scores``, ``kernel``, ...; ``kernels.base`` lists them).
    context: (B, H, Lq, d) the per-head weighted sums, before the head merge.
    steps: each step's cache by name, in forward order: "qkv_proj" (self-attention: one GEMM) or
        "q_proj", "k_proj", "v_proj"; "q_split", "k_split", "v_split"; "q_rope", "k_rope" (rope_theta);
        "kv_cache" (the number of positions cached before the call); "rel_bias" (rel_pos_max_distance);
        "bias_k", "bias_v" (add_bias_kv); "zero_k", "zero_v" (add_zero_attn); "diff_values" (diff_attention);
        "k_repeat", "v_repeat" (grouped-query); "diff_lambda", "diff_combine" (diff_attention); "gate_query",
        "output_gate" (output_gate); MLA's "q_a_proj" ... "k_join" (kv_lora_rank); "merge";
        "out_proj". Each is the cache of the ``functional`` pair of that name's kind.
    owner: the module that made the cache; ``backward`` refuses a cache of another module.
    plan: the steps of the call, which ``backward`` walks in reverse.
    """

    Q: np.ndarray
    K: np.ndarray
    V: np.ndarray
    attention: object
    context: np.ndarray
    steps: dict
    owner: object = None
    plan: tuple = ()

    @property
    def attn_weights(self) -> np.ndarray:
        """(B, H, Lq, Lk) attention weights after softmax, before dropout."""
        return self.attention.attn_weights

    @property
    def scores(self) -> np.ndarray:
        """(B, H, Lq, Lk) scaled scores (plus every score term) before the mask; with ``softcap=``, after the cap."""
        return self.attention.scores

    @property
    def dropout_mask(self) -> np.ndarray | None:
        """(B, H, Lq, Lk) bool keep-mask used by dropout, or None."""
        return self.attention.dropout_mask

    @property
    def lse(self) -> np.ndarray:
        """(B, H, Lq) float64 each row's log-sum-exp of the masked scores (the kernel's ``lse``)."""
        return self.attention.lse


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
    ``block_size`` and ``num_threads``, None = measured defaults), "auto", or a kernel object. All give the same
    outputs and gradients.

    ``options`` (each declared once, on its step: ``print(steps.describe_options())`` lists them with their defaults;
    ``steps.AttentionConfig`` checks them; each turns on one step of the data path, and every combination runs with
    every kernel or is refused by ``steps.build_steps`` naming both options):

    - ``head_dim`` d (None = E / H): heads of another size than E / H, W_q (H·d, E), W_o (E, H·d) (Gemma, Qwen3);
      ``scale`` of the scores (None = 1/√d).

    - ``num_kv_heads`` Hkv (None = H): grouped-query (1 = multi-query) attention, W_k (Hkv·d, kdim), W_v (Hkv·d,
      vdim), b_k, b_v (Hkv·d,); query head h reads key/value head h // (H / Hkv).
    - ``rope_theta``: rotates Q and K per head (RoPE, Hugging Face Llama convention, positions 0, 1, ... or
      ``forward(..., positions=)``).
    - ``qk_norm=True``: an RMSNorm of each head of Q and K with learned weights (Qwen3; eps ``qk_norm_eps``).
    - ``alibi=True``: ALiBi's distance penalty added to the scores. ``softcap`` c: scores c · tanh(s / c) (Gemma 2).
      ``head_temperature=True``: scores · exp(t_h), a learned temperature per head (``params["head_temperature"]``).
    - ``rel_pos_max_distance`` R: a learned bias per head and clipped distance j - i added to the scores
      (T5-style), ``params["rel_bias"]`` (H, 2R + 1).
    - ``add_bias_kv=True``, ``add_zero_attn=True``: torch MHA's learned key/value ``params["bias_k"]``,
      ``params["bias_v"]`` (Hkv·d,) and its zero key/value, appended after the keys (every query may attend to
      them; no mask or score term reaches them).
    - ``sinks=True``: a learned logit per head, ``params["sinks"]`` (H,), in every row's softmax denominator: weight
      that goes to no key (gpt-oss's attention sinks); ``attn_weights`` are the keys' (a row sums to less than 1).
    - ``diff_attention=True``: differential attention (Hugging Face DiffLlama; even Hkv): query heads p and
      p + H/2 make a pair whose two softmax maps read the same 2d-wide values (key/value heads j and j + Hkv/2 side
      by side) and are subtracted, (A_p − λ A_{p+H/2}) V, with λ = exp(λ_q1·λ_k1) − exp(λ_q2·λ_k2) + λ_init
      (``params["lambda_q1"]`` ... (d,), λ_init = 0.8 − 0.6·exp(−0.3·``diff_layer_idx``)), then an RMSNorm over
      the pair's 2d features (eps ``diff_norm_eps``) times 1 − λ_init. ``cache.attn_weights`` are the H maps
      themselves; ``cache.V`` is (B, Hkv, Lk, 2d) and ``cache.context`` (B, H/2, Lq, 2d). Not with dropout > 0 or
      ``recompute=True`` (refused, naming both).
    - ``kv_lora_rank`` r (with ``qk_rope_head_dim``, ``qk_nope_head_dim``, ``v_head_dim``, ``q_lora_rank``,
      ``rope_interleave``, ``norm_eps``; ``rope_theta`` needed): multi-head latent attention, DeepSeek's MLA
      (``MultiHeadLatentAttention`` is this with DeepSeek's defaults); the values come from the key's latent.
    - ``recompute=True``: trades one more forward of the projections and the kernel for memory (activation
      checkpointing, ``mha_numpy/flow.py``): forward and backward run one key/value head and its query heads at a
      time, the cache keeps only the inputs, and the backward recomputes each group's forward. Same outputs and
      gradients (to rounding); sampled dropout draws its own keep-masks per group (``cache.dropout_mask`` shows
      them); no ``kv_cache``.
    - ``memory_budget`` (bytes; None: the kernel's default, 64 MiB on ``impl="auto"``, none on the others): a call
      whose backward would keep more than this (Q, K, V, the context, their gradients and the kernel's score
      arrays: ``flow.kept_bytes``) runs as ``recompute=True`` does, so that ``impl="auto"`` needs no flag at long
      sequences (49 MiB instead of 129 beyond the output and gradients at L = 16384, E = 256, H = 4, float32). A
      call that cannot recompute (a KV cache, differential attention) runs the default path.

    ``forward(..., kv_cache=KVCache())`` decodes incrementally (forward only). Options can be read as attributes
    (``mha.num_kv_heads``) and changed by assignment (``mha.dropout = 0.1``, checked again), and so can the kernel
    (``mha.kernel = "chunked"`` or a kernel object).

    Threads: one module may serve several threads (forward and backward only read ``params``; each call has its
    own cache), except in training with dropout > 0 and no ``dropout_mask``: the keep-mask is drawn from
    ``self.rng``, one NumPy Generator, which is not thread-safe.
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
        **options,
    ) -> None:
        config = AttentionConfig(embed_dim, num_heads, bias, kdim, vdim, dropout, dtype, **options)  # checked
        self.__dict__["config"] = config
        self.kernel = get_kernel(impl, block_size=block_size, num_threads=num_threads)
        self.rng = as_generator(rng)
        self.params: dict[str, np.ndarray] = self._initial_params()

    def __getattr__(self, name: str):  # only for names not found the usual way: the options
        config = self.__dict__.get("config")
        if config is not None and (name in OPTIONS or name in ("q_dim", "kv_dim", "qk_head_dim", "merged_dim")):
            return getattr(config, name)
        if name in ("block_size", "num_threads") and hasattr(self.__dict__.get("kernel"), name):
            return getattr(self.__dict__["kernel"], name)  # the chunked kernel's settings
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __setattr__(self, name: str, value) -> None:
        if name in OPTIONS:  # an option: checked again, and the next call's steps follow it
            self.__dict__["config"] = self.config.replace(**{name: value})
        elif name in ("kernel", "impl"):  # a registered name or a kernel object, resolved and checked now
            self.__dict__["kernel"] = get_kernel(value)
        elif name in ("block_size", "num_threads"):  # the kernel's settings, checked by it (not a stray attribute)
            if not hasattr(self.kernel, name):
                raise ValueError(f"{name} is a setting of the chunked kernel; this module's kernel is {self.impl!r}")
            setattr(self.kernel, name, value)
        else:
            super().__setattr__(name, value)

    @property
    def impl(self) -> str:
        """The name of the kernel (``mha.kernel.name``); assign a name or a kernel object to change it."""
        return self.kernel.name

    def __repr__(self) -> str:
        c, first = self.config, ("embed_dim", "num_heads", "bias", "kdim", "vdim", "dropout", "dtype")
        shown = {k: getattr(c, k) for k in first} | {"dtype": c.dtype.name}
        shown |= {k: f"{v:g}" if isinstance(v, float) else v for k, v in c.changed().items() if k not in first}
        return (
            f"{type(self).__name__}("
            + ", ".join(f"{k}={v}" for k, v in shown.items())  # the options in effect (``steps.OPTIONS``)
            + ("" if self.impl == "vectorized" else f", impl={self.kernel!r}")
            + ")"
        )

    @property
    def steps(self) -> tuple:
        """The steps of a call (without a KV cache), in forward order; ``backward`` walks them reversed."""
        return self._plan()[0]

    def describe(self, kv_cache: bool | str = False) -> str:
        """The data path as text: one line per step, the caches it names and the parameters it owns.

        kv_cache: False, True, or what a cache stores ("keys after RoPE", "keys before RoPE": a StreamingKVCache's
        plan) -> the plan of a call with such a cache."""
        if kv_cache not in (False, True, "keys after RoPE", "keys before RoPE"):
            raise ValueError(f"kv_cache must be True, False, 'keys after RoPE' or 'keys before RoPE', got {kv_cache!r}")
        return describe(self.config, build_steps(self.config, kv_cache))

    def new_kv_cache(self):
        """An empty KV cache of the kind this module decodes with: a ``KVCache``, or a ``LatentCache`` in latent
        attention (the first kind its cache step takes; a ``StreamingKVCache`` is the other choice of both)."""
        step = next(step for step in self._plan(kv_cache=True)[0] if step.option == "kv_cache")
        return step.cache_type[0]()

    # ------------------------------------------------------------------ parameters

    def _plan(self, kv_cache: bool | str = False) -> tuple[tuple, dict]:
        """The steps of a call and their parameters by name (in the order of initialisation, ``steps.Param.rank``),
        made once per options: a step holds nothing of a call, so the same list serves every call."""
        config, plans = self.config, self.__dict__.setdefault("_plans", {})
        if plans.get("config") is not config:  # options changed (or the first call): plan again
            plans.clear()
            plans["config"] = config
        if kv_cache not in plans:
            steps = build_steps(config, kv_cache)  # the refusals, here
            specs = sorted(((n, p) for step in steps for n, p in step.params().items()), key=lambda item: item[1].rank)
            plans[kv_cache] = steps, dict(specs)  # stable sort: the data path's order within a rank
        return plans[kv_cache]

    def _initial_params(self) -> dict[str, np.ndarray]:
        return {name: spec.init(self.rng, self.config.dtype) for name, spec in self._plan()[1].items()}

    def _check_params(self, specs: dict) -> None:
        """``params`` must hold exactly the steps' parameters, with their shapes, in the module's dtype."""
        P, dtype = self.params, self.config.dtype
        missing, extra = [n for n in specs if n not in P], [n for n in P if n not in specs]
        if missing or extra:
            raise ValueError(
                f"params has {'no ' + ', '.join(missing) if missing else ''}"
                f"{' and ' if missing and extra else ''}{'an unknown ' + ', '.join(extra) if extra else ''}; "
                f"the module's options need exactly {', '.join(specs)}"
            )
        for name, spec in specs.items():
            p = P[name]
            if not isinstance(p, np.ndarray) or p.shape != spec.shape or p.dtype != dtype:
                raise ValueError(
                    f"params[{name!r}] has dtype {getattr(p, 'dtype', type(p).__name__)} and shape {np.shape(p)}; "
                    f"the module needs {dtype} {spec.shape} (convert with .astype(np.{dtype.name}))"
                )

    # ------------------------------------------------------------------ checks

    def _check_inputs(self, query, key, value):
        """query, key (None: the query), value (None: the key) as checked arrays; in latent attention the values
        come from the key's latent, so a value must be omitted or be the key."""
        c = self.config
        if c.latent and value is not None and value is not key and value is not query:
            raise ValueError("value must be omitted (or be the key) in latent attention (kv_lora_rank): its values "
                             "are expanded from the key's latent")  # fmt: skip
        if c.kv_sharing == "reuse":  # key, value: another layer's K and V (ShareKV checks their shapes)
            return self._check_shared(query, key, value)
        query = as_float_array(query, "query", ndim=3)
        key = query if key is None else as_float_array(key, "key", ndim=3)
        value = key if value is None or c.latent else as_float_array(value, "value", ndim=3)
        for name, x, size, what in (
            ("query", query, c.embed_dim, "embed_dim"),
            ("key", key, c.kdim, "kdim"),
            ("value", value, c.kdim if c.latent else c.vdim, "vdim"),
        ):
            if x.shape[-1] != size:
                raise ValueError(f"{name} with shape {x.shape}: last dim must be {what}={size}")
            if x.dtype != c.dtype:
                raise ValueError(
                    f"{name} has dtype {x.dtype} (shape {x.shape}) but the parameters are {c.dtype}; "
                    f"convert with .astype(np.{c.dtype.name}) or build the module with dtype=np.{x.dtype.name}"
                )
        if not query.shape[0] == key.shape[0] == value.shape[0]:
            raise ValueError(f"batch sizes differ: query {query.shape}, key {key.shape}, value {value.shape}")
        if key.shape[1] != value.shape[1]:
            raise ValueError(f"key and value lengths differ: key {key.shape}, value {value.shape}")
        return query, key, value

    def _check_shared(self, query, key, value):
        """A kv_sharing="reuse" layer's inputs: query (B, Lq, E), key and value its source layer's K and V
        (B, Hkv, Lk, d), in the module's dtype."""
        c = self.config
        query = as_float_array(query, "query", ndim=3)
        if key is None or value is None:
            raise ValueError("a kv_sharing='reuse' layer needs key= and value=: its source layer's K and V")
        key, value = as_float_array(key, "key", ndim=4), as_float_array(value, "value", ndim=4)
        for name, x in (("query", query), ("key", key), ("value", value)):
            if x.dtype != c.dtype:
                raise ValueError(f"{name} has dtype {x.dtype} but the parameters are {c.dtype}")
        if query.shape[-1] != c.embed_dim:
            raise ValueError(f"query with shape {query.shape}: last dim must be embed_dim={c.embed_dim}")
        return query, key, value

    def _begin(self, steps, specs, query, key, value, mask, training, dropout_mask, positions, kv_cache) -> Flow:
        """Check every argument of a call, before any arithmetic -> the call's flow, ready for its steps."""
        c = self.config
        query, key, value = self._check_inputs(query, key, value)
        self._check_params(specs)
        if dropout_mask is not None and not training:
            raise ValueError("dropout_mask is only used with training=True")
        if positions is not None and c.rope_theta is None:
            raise ValueError("positions= rotates queries and keys: it needs a module with rope_theta set")
        H, (B, Lq, _), Lk = c.num_heads, query.shape, key.shape[2 if key.ndim == 4 else 1]  # 4-D: shared K
        f = Flow(query=query, key=key, value=value, P=self.params, H=H, Hkv=c.num_kv_heads, heads=slice(0, H),
                 B=B, Lq=Lq, Lk=Lk, positions=positions, kv_cache=kv_cache, owner=self,
                 self_attention=query is key is value and c.kdim == c.vdim == c.embed_dim)  # fmt: skip
        for step in steps:
            step.check(f)  # the call arguments each step reads (positions, kv_cache)
        keys = f.cached + Lk  # the sequence's keys: the ones a mask covers
        shape = (B, H, Lq, keys + sum(step.appended for step in steps))  # (B, H, Lq, Lk): the scores' shape
        p_drop = c.dropout if training else 0.0
        f.args = check_args(
            shape, c.head_dim, mask, c.scale, p_drop, self.rng, dropout_mask, dtype=c.dtype, mask_keys=keys
        )  # head_dim: the query/key heads' width, dqk in MLA
        f.pos_q = np.arange(f.cached, f.cached + Lq) if positions is None else positions  # RoPE's positions
        f.pos_k = np.arange(f.cached, keys) if positions is None else positions
        f.kernel = self.kernel.choose(shape)  # the kernel of this call, once (``auto`` picks one by the shape)
        f.matmul = f.kernel.matmul  # the projections' products run on the kernel's threads (mha_numpy/threads.py)
        return f

    # ------------------------------------------------------------------ forward / backward

    def forward(
        self,
        query: np.ndarray,
        key: np.ndarray | None = None,
        value: np.ndarray | None = None,
        mask: np.ndarray | None = None,
        training: bool = False,
        dropout_mask: np.ndarray | None = None,
        positions: np.ndarray | None = None,
        kv_cache=None,
    ) -> tuple[np.ndarray, MHACache]:
        """query (B, Lq, E), key (B, Lk, kdim), value (B, Lk, vdim) -> output (B, Lq, E), cache.

        key None: the query (self-attention); value None: the key. In latent attention (``kv_lora_rank``) the
        values come from the key's latent: value is omitted (or the key).

        mask: bool (True = may attend) or float (added), broadcastable to (B, H, Lq, Lk), or a
            ``masks.StructuredMask`` (causal, window, documents, prefix, padding given by their rule: the chunked
            kernel classifies its tiles from it, the other kernels build its entries).
        training: apply dropout to the attention weights (when ``dropout`` > 0).
        dropout_mask: optional bool keep-mask (B, H, Lq, Lk) used instead of sampling (Lk counts the keys that
            ``add_bias_kv`` / ``add_zero_attn`` append).
        positions: RoPE positions of the tokens, (L,) or (B, L) (self-attention); default 0, 1, ... (after a
            KV cache: its length, length + 1, ...).
        kv_cache: a ``KVCache`` (self-attention, forward only): the call's keys and values are appended and the
            queries attend to every cached position, causally within the call; Lk above counts them all. A
            ``StreamingKVCache`` keeps its sink tokens and window instead (its mask; no ``positions=``). Latent
            attention: a ``LatentCache`` (c_kv and the rope key, not K and V) or a ``StreamingKVCache``.
        """
        stores = False if kv_cache is None else getattr(kv_cache, "stores", True)  # a KVCache's kind, or True
        steps, specs = self._plan(kv_cache=stores)  # this call's data path; refusals here
        f = self._begin(steps, specs, query, key, value, mask, training, dropout_mask, positions, kv_cache)
        if self.config.recompute or self._over_budget(steps, f, stores):  # head group by head group (flow.py)
            return flow.recompute_forward(steps, f, specs)
        s = flow.forward(steps, f)  # every step, in order
        return f.output, MHACache(f.Q, f.K, f.V, f.attention, f.context, s, owner=self, plan=steps)

    def _over_budget(self, steps, f: Flow, stores: bool) -> bool:
        """Whether this call would keep more for its backward than the memory budget (``memory_budget``, or the
        kernel's default: 64 MiB on ``impl="auto"``) and can run as ``recompute=True`` does instead (no KV cache,
        every step groupwise)."""
        budget = self.config.memory_budget
        budget = self.kernel.default_memory_budget if budget is None else budget
        if budget is None or stores or not all(step.groupwise for step in steps):
            return False
        return flow.kept_bytes(f) > budget

    __call__ = forward

    def backward(self, d_output: np.ndarray, cache: MHACache, d_shared_kv=None) -> dict[str, np.ndarray]:
        """d_output (B, Lq, E) -> dict of gradients.

        Keys: "query" (B, Lq, E), "key" (B, Lk, kdim), "value" (B, Lk, vdim), and one per
        ``params`` key with that parameter's shape. For self-attention (the same array passed
        as query, key and value, or key and value omitted) its gradient is grads["query"] + grads["key"] +
        grads["value"]. In latent attention "value" is zeros: the values come from the key's latent.
        d_shared_kv: with kv_sharing="store", (dK, dV) (B, Hkv, Lk, d) each, the gradients of this call's K and V
        from the layers that read them (the sum of their grads["key"], grads["value"]), added to its own.
        """
        if d_shared_kv is not None:
            d_shared_kv = _check_shared_grads(self, cache, d_shared_kv)
        return backward_through_plan(self, d_output, cache, ("query", "key", "value"), d_shared_kv)


def _check_shared_grads(module, cache, d_shared_kv) -> tuple:
    """(dK, dV) of a kv_sharing="store" call, checked: the shapes and dtype of the call's K and V."""
    if module.config.kv_sharing != "store" or not isinstance(cache, MHACache):
        raise ValueError("d_shared_kv is for a kv_sharing='store' module's cache: its K and V have readers")
    if not isinstance(d_shared_kv, (tuple, list)) or len(d_shared_kv) != 2:
        raise ValueError(f"d_shared_kv must be (dK, dV), got {type(d_shared_kv).__name__}")
    out = tuple(as_float_array(d, "d_shared_kv", ndim=4) for d in d_shared_kv)
    for d, x in zip(out, (cache.K, cache.V)):
        if d.shape != x.shape or d.dtype != x.dtype:
            raise ValueError(f"d_shared_kv must match the call's K and V, {x.shape} {x.dtype}; got {d.shape} {d.dtype}")
    return out


def backward_through_plan(
    module, d_output: np.ndarray, cache, inputs: tuple[str, ...], d_shared_kv=None
) -> dict[str, np.ndarray]:
    """The backward of a module whose forward walked a plan of steps (``MultiHeadAttention``, latent attention
    included): the cache and d_output checked before any arithmetic (``check_backward_call``), then every step in
    reverse (or, for a ``RecomputeCache``, each head group recomputed first).

    -> {each of ``inputs``: its gradient (zeros for one no step read: latent attention's value), and one per
    ``module.params`` key}."""
    d_output = check_backward_call(module, d_output, cache)
    if isinstance(cache, RecomputeCache):  # recompute each head group's forward, then its backward
        params = {name: np.zeros_like(p) for name, p in module.params.items()}
        grads = flow.recompute_backward(cache, d_output, params)
    else:
        kernel = cache.attention.kernel  # the kernel that ran the forward, and its product for the projections
        g = Flow(output=d_output, P={}, kernel=kernel, matmul=kernel.matmul, attention=cache.attention,
                 shared_kv=d_shared_kv)  # fmt: skip
        flow.backward(cache.plan, g, cache.steps)  # every step, in reverse
        grads, params = {name: getattr(g, name) for name in inputs}, {name: g.P[name] for name in module.params}
    for name in inputs:
        grads[name] = np.zeros_like(grads["key"]) if grads.get(name) is None else grads[name]
    return {**grads, **params}


def check_backward_call(module, d_output, cache) -> np.ndarray:
    """A backward's arguments, checked before any arithmetic: the cache is this module's, of a differentiable call,
    and d_output (B, Lq, E) in the module's dtype -> d_output as an array; ValueError naming what is wrong."""
    if not isinstance(cache, (MHACache, RecomputeCache)):
        raise ValueError(
            f"cache must be the cache returned by this module's forward (an MHACache), got {type(cache).__name__}"
        )
    if cache.owner is not module:
        raise ValueError(f"cache must be the cache returned by this module's forward: this one was made by another "
                         f"{type(module).__name__}")  # fmt: skip
    refused = [step.option for step in cache.plan if not step.differentiable]
    if refused:
        raise ValueError(
            f"backward through a call with {refused[0]} is not supported: the cache is state (forward only)"
        )
    d_output = as_float_array(d_output, "d_output", ndim=3)
    if isinstance(cache, RecomputeCache):
        B, Lq = cache.flow.query.shape[:2]  # query (B, Lq, E)
    else:
        B, Lq = cache.context.shape[0], cache.context.shape[2]  # context (B, H, Lq, dv)
    expected, dtype = (B, Lq, module.config.embed_dim), module.config.dtype
    if d_output.shape != expected or d_output.dtype != dtype:
        raise ValueError(f"d_output has shape {d_output.shape} and dtype {d_output.dtype}; expected {expected} and "
                         f"{dtype} like the output")  # fmt: skip
    return d_output
