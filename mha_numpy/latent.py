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

from dataclasses import fields, replace

import numpy as np

from . import flow
from ._checks import as_float_array, as_generator
from .attention import MHACache, backward_through_plan
from .flow import Flow
from .kernels import check_args, get_kernel
from .latent_steps import LatentConfig, build_latent_steps
from .steps import describe

_SIZES = ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")
_OPTIONS = tuple(f.name for f in fields(LatentConfig))
_KEYWORDS = ("rope_theta", "rope_interleave", "norm_eps", "scale", "recompute")  # the options given by name


class MultiHeadLatentAttention:
    """Multi-head latent attention (DeepSeek-V2, V3) with a hand-written backward, in Hugging Face's weight layout.

    embed_dim E, num_heads H, kv_lora_rank r, qk_rope_head_dim dr, qk_nope_head_dim dn, v_head_dim dv (the query and
    key heads are dqk = dn + dr wide, the value heads dv). ``params``: W_q (H·dqk, E), or with ``q_lora_rank`` rq
    W_qa (rq, E), q_a_norm (rq,), W_qb (H·dqk, rq); W_kva (r + dr, E), kv_a_norm (r,), W_kvb (H·(dn + dv), r);
    W_o (E, H·dv); with ``bias`` b_qa, b_kva, b_o. Linear weights U(±1/√fan_in) as torch's nn.Linear, norms 1.
    ``options`` (``latent_steps.LatentConfig`` checks them): rope_theta, rope_interleave (DeepSeek's pairs (0, 1),
    (2, 3), ...; default True as HF's config), norm_eps, scale, recompute. ``impl``, ``block_size``,
    ``num_threads`` and ``rng`` as ``MultiHeadAttention``'s.

    ``forward(query, key=None, ...)``: self-attention when ``key`` is None, as DeepSeek uses it; a ``key`` gives the
    tokens the latent is made from (Lk may differ from Lq). ``forward(..., kv_cache=LatentCache())`` decodes: the
    cache keeps c_kv and the rope key, not K and V. Causality is not part of the module: pass
    ``masks.causal_mask(L)`` (a cache makes each call causal within itself and after the cached positions).
    Threads: as ``MultiHeadAttention``.
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
        **options,
    ) -> None:
        unknown = sorted(set(options) - set(_KEYWORDS))
        if unknown:
            raise ValueError(f"unknown option {unknown[0]!r}; the options are {', '.join(_KEYWORDS)}")
        sizes = (kv_lora_rank, qk_rope_head_dim, qk_nope_head_dim, v_head_dim)
        config = LatentConfig(embed_dim, num_heads, *sizes, q_lora_rank, bias, dropout=dropout, dtype=dtype, **options)
        self.__dict__["config"] = config
        self.kernel = get_kernel(impl, block_size=block_size, num_threads=num_threads)
        self.rng = as_generator(rng)
        self.params: dict[str, np.ndarray] = {n: p.init(self.rng, config.dtype) for n, p in self._plan()[1].items()}

    def __getattr__(self, name: str):  # only for names not found the usual way: the options
        config = self.__dict__.get("config")
        if config is not None and (name in _OPTIONS or name in ("qk_head_dim", "q_dim", "merged_dim")):
            return getattr(config, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __setattr__(self, name: str, value) -> None:
        if name in _OPTIONS:  # an option: checked again; the next call's steps and parameters follow it
            self.__dict__["config"] = replace(self.config, **{name: value})
        elif name in ("kernel", "impl"):
            self.__dict__["kernel"] = get_kernel(value)
        else:
            super().__setattr__(name, value)

    @property
    def impl(self) -> str:
        return self.kernel.name

    def __repr__(self) -> str:
        c = self.config
        shown = ", ".join(f"{k}={v}" for k, v in c.changed().items() if k not in ("dtype",))
        return (
            f"MultiHeadLatentAttention(embed_dim={c.embed_dim}, num_heads={c.num_heads}, "
            + ", ".join(f"{n}={getattr(c, n)}" for n in _SIZES)
            + f", dtype={c.dtype.name}"
            + ("" if self.impl == "vectorized" else f", impl={self.kernel!r}")
            + (f", {shown}" if shown else "")
            + ")"
        )

    @property
    def steps(self) -> tuple:
        """The steps of a call (without a cache), in forward order; ``backward`` walks them reversed."""
        return self._plan()[0]

    def describe(self, kv_cache: bool = False) -> str:
        """The data path as text: one line per step and the parameters it owns."""
        return describe(self.config, build_latent_steps(self.config, kv_cache))

    def _plan(self, kv_cache: bool = False) -> tuple[tuple, dict]:
        """The steps of a call and their parameters by name (``MultiHeadAttention._plan``'s rule: once per options)."""
        config, plans = self.config, self.__dict__.setdefault("_plans", {})
        if plans.get("config") is not config:
            plans.clear()
            plans["config"] = config
        if kv_cache not in plans:
            steps = build_latent_steps(config, kv_cache)  # the refusals, here
            specs = sorted(((n, p) for step in steps for n, p in step.params().items()), key=lambda item: item[1].rank)
            plans[kv_cache] = steps, dict(specs)
        return plans[kv_cache]

    # ------------------------------------------------------------------ checks

    def _check_params(self, specs: dict) -> None:
        P, dtype = self.params, self.config.dtype
        if set(P) != set(specs):
            raise ValueError(f"params has {sorted(P)}; the module's options need exactly {', '.join(specs)}")
        for name, spec in specs.items():
            p = P[name]
            if not isinstance(p, np.ndarray) or p.shape != spec.shape or p.dtype != dtype:
                raise ValueError(
                    f"params[{name!r}] has dtype {getattr(p, 'dtype', type(p).__name__)} and shape {np.shape(p)}; "
                    f"the module needs {dtype} {spec.shape}"
                )

    def _begin(self, steps, specs, query, key, mask, training, dropout_mask, positions, kv_cache) -> Flow:
        """Check every argument of a call, before any arithmetic -> the call's flow, ready for its steps."""
        c = self.config
        query = as_float_array(query, "query", ndim=3)
        key = query if key is None else as_float_array(key, "key", ndim=3)
        for name, x in (("query", query), ("key", key)):
            if x.shape[-1] != c.embed_dim or x.dtype != c.dtype:
                raise ValueError(
                    f"{name} has shape {x.shape} and dtype {x.dtype}; the module needs (B, L, {c.embed_dim}) {c.dtype}"
                )
        if query.shape[0] != key.shape[0]:
            raise ValueError(f"batch sizes differ: query {query.shape}, key {key.shape}")
        self._check_params(specs)
        if dropout_mask is not None and not training:
            raise ValueError("dropout_mask is only used with training=True")
        H, (B, Lq, _), Lk = c.num_heads, query.shape, key.shape[1]
        f = Flow(query=query, key=key, P=self.params, H=H, Hkv=H, heads=slice(0, H), B=B, Lq=Lq, Lk=Lk,
                 positions=positions, kv_cache=kv_cache, owner=self)  # fmt: skip
        for step in steps:
            step.check(f)  # positions (DecoupledRope), kv_cache (AppendLatent)
        keys = f.cached + Lk
        shape = (B, H, Lq, keys)
        p_drop = c.dropout if training else 0.0
        f.args = check_args(shape, c.qk_head_dim, mask, c.scale, p_drop, self.rng, dropout_mask, dtype=c.dtype)
        f.pos_q = np.arange(f.cached, f.cached + Lq) if positions is None else positions
        f.pos_k = np.arange(f.cached, keys) if positions is None else positions
        f.kernel = self.kernel.choose(shape)
        f.matmul = f.kernel.matmul
        return f

    # ------------------------------------------------------------------ forward / backward

    def forward(
        self,
        query: np.ndarray,
        key: np.ndarray | None = None,
        mask: np.ndarray | None = None,
        training: bool = False,
        dropout_mask: np.ndarray | None = None,
        positions: np.ndarray | None = None,
        kv_cache=None,
    ) -> tuple[np.ndarray, MHACache]:
        """query (B, Lq, E), key (B, Lk, E) or None (= query) -> output (B, Lq, E), cache.

        mask: bool (True = may attend) or float (added), broadcastable to (B, H, Lq, Lk). positions: RoPE positions
        (L,) or (B, L) (self-attention; default 0, 1, ... after a cache's length). kv_cache: a ``LatentCache``
        (self-attention, forward only). The cache's ``Q`` (B, H, Lq, dqk), ``K`` (B, H, Lk, dqk) and ``V``
        (B, H, Lk, dv) are after RoPE and the expansion; ``steps`` holds each step's cache by name.
        """
        steps, specs = self._plan(kv_cache=kv_cache is not None)
        f = self._begin(steps, specs, query, key, mask, training, dropout_mask, positions, kv_cache)
        if self.config.recompute:  # one head at a time, keeping only the inputs (flow.py)
            return flow.recompute_forward(steps, f, specs)
        s = flow.forward(steps, f)
        return f.output, MHACache(f.Q, f.K, f.V, f.attention, f.context, s, owner=self, plan=steps)

    __call__ = forward

    def backward(self, d_output: np.ndarray, cache: MHACache) -> dict[str, np.ndarray]:
        """d_output (B, Lq, E) -> {"query": (B, Lq, E), "key": (B, Lk, E), and one per ``params`` key}.

        For self-attention (key None) the input's gradient is grads["query"] + grads["key"]: the query's path and
        the latent's, as ``MultiHeadAttention`` returns its three.
        """
        return backward_through_plan(self, d_output, cache, ("query", "key"))
