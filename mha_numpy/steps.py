"""The data path of ``MultiHeadAttention`` as data: its options, its steps, and the one function that builds the
step list of a call from the options (``build_steps``).

    Project     q, k, v = query W_qᵀ + b_q, key W_kᵀ + b_k, value W_vᵀ + b_v    (B, Lq, E), (B, Lk, Ekv) × 2
    Split       Q (B, H, Lq, d), K, V (B, Hkv, Lk, d)
    [QKNorm]    Q, K normalised per head (RMSNorm with learned weights)
    [Rope]      Q, K turned by the angles of their positions
    [AppendToCache]  K, V appended to the KV cache: (B, Hkv, cached + Lk, d), causal within the call
    [RelativeBias]   a learned (1, H, Lq, Lk) term for the scores, by distance
    [Alibi]     a fixed (1, H, Lq, Lk) term for the scores, by distance
    [SoftCap]   the scores capped, cap · tanh(s / cap), inside the kernel
    [Sinks]     a learned logit per head in every row's softmax denominator, inside the kernel (gpt-oss)
    [BiasKV]    a learned key and value appended: (B, Hkv, Lk + 1, d)
    [ZeroAttn]  a zero key and value appended
    [DiffValues]     V: key/value heads j and j + Hkv/2 side by side, (B, Hkv, Lk, 2d) (differential attention)
    RepeatKV    K, V shared by the query heads: (B, H, Lk, d)
    Attend      context = softmax(Q Kᵀ · scale + score terms + mask) V, by the kernel    (B, H, Lq, d)
    [DiffCombine]    heads p and p + H/2: (1 − λ_init) · RMSNorm(C_p − λ C_{p+H/2}), (B, H/2, Lq, 2d)
    Merge       merged (B, Lq, E)
    OutProject  output = merged W_oᵀ + b_o    (B, Lq, E)

E = embed_dim, H = num_heads, Hkv = num_kv_heads, d = E / H, Ekv = Hkv · d; steps in [brackets] are optional.

A step is a small class, micrograd's rule applied: its forward travels with its backward.

    forward(f, s)   reads and writes the tensors of the flow ``f`` (``flow.Flow``: every tensor of a call by the
                    name used above) and keeps what its backward needs in ``s`` under its cache names
                    (``MHACache.steps``)
    backward(g, s)  ``g`` holds the gradients of the same names: it turns the gradients of what forward wrote into
                    the gradients of what forward read, its lines the forward's reversed (``# ← F1``)
    params()        the parameters it owns (``Param``: shape, initialisation, which axis runs over heads)
    check(f)        the checks of the call's arguments it reads, run before any arithmetic

and declares what it can do: ``groupwise`` (it runs on one group of heads alone, which ``recompute=True`` needs;
a step that cannot says why in ``not_groupwise``), ``decodes`` (it runs on a call that appends to a KV cache; why
not in ``not_decodes``), ``with_dropout`` (it runs with dropout on the weights; why not in ``not_with_dropout``),
``differentiable`` (has a backward), ``appended`` (keys it adds after the sequence's).
``build_steps`` refuses a combination by those declarations, naming both options.
``MultiHeadAttention`` checks the call, walks the list forwards and, in ``backward``, reversed (``flow.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from functools import partial

import numpy as np

from . import functional as F
from . import masks
from ._checks import as_float_dtype, check_probability
from .kernels import ScoreMod
from .kv_cache import KVCache

# --------------------------------------------------------------------------- the options


def _positive_int(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return int(value)


def _non_negative_int(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ValueError(f"{name} must be a non-negative int, got {value!r}")
    return int(value)


def _flag(value, name: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def _kv_heads(value, num_heads: int) -> int:
    Hkv = num_heads if value is None else value
    if isinstance(Hkv, bool) or not isinstance(Hkv, (int, np.integer)) or Hkv <= 0:
        raise ValueError(f"num_kv_heads must be a positive int or None, got {value!r}")
    if num_heads % Hkv:
        raise ValueError(
            f"num_heads={num_heads} is not a multiple of num_kv_heads={Hkv}: each key/value head serves "
            "num_heads // num_kv_heads query heads"
        )
    return int(Hkv)


def _rope_theta(theta, head_dim: int) -> float | None:
    if theta is None:
        return None
    if isinstance(theta, bool) or not isinstance(theta, (int, float, np.integer, np.floating)) or not theta > 0:
        raise ValueError(f"rope_theta must be a positive number or None, got {theta!r}")
    if head_dim % 2:
        raise ValueError(f"rope_theta needs an even head dim (RoPE turns pairs of features): head dim {head_dim}")
    return float(theta)


def _positive_or_none(value, name: str) -> float | None:
    if value is None:
        return None
    number = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
    if not number or not 0 < value < np.inf:
        raise ValueError(f"{name} must be a positive finite number or None, got {value!r}")
    return float(value)


def _diff_kv_heads(diff: bool, num_kv_heads: int) -> None:
    if diff and num_kv_heads % 2:
        raise ValueError(
            f"diff_attention needs an even num_kv_heads (key/value heads j and j + Hkv/2 make a pair's keys and "
            f"values, as in Hugging Face DiffLlama), got num_kv_heads={num_kv_heads}"
        )


@dataclass(frozen=True)
class AttentionConfig:
    """Every option of the data path, checked (``ValueError`` naming the option) and resolved (None -> its default).

    embed_dim E, num_heads H (d = E / H); kdim, vdim: the key / value features (None: E); bias: the projections'
    biases; dropout: on the attention weights in training; dtype: float32 or float64; head_dim d (None: E / H;
    given, the heads need not tile E: W_q is (H·d, E) and W_o (E, H·d), as in Gemma and Qwen3); scale: of the
    scores (None: 1/√d; Gemma 2 uses query_pre_attn_scalar^-1/2). The optional steps:
    num_kv_heads Hkv (None: H) key/value heads, grouped-query (1: multi-query) attention; rope_theta: rotary
    positions (RoPE) on Q and K; alibi: ALiBi's distance penalty added to the scores; rel_pos_max_distance R: a
    learned bias per head and clipped distance (T5-style); add_bias_kv, add_zero_attn: torch MHA's learned and zero
    extra key/value; sinks: a learned logit per head in every row's softmax denominator (gpt-oss's attention
    sinks); diff_attention: differential attention (DiffLlama; heads p and p + H/2 make a pair whose two
    maps are subtracted with a learned λ; λ_init from diff_layer_idx; an RMSNorm of eps diff_norm_eps per pair);
    recompute: keep only the inputs and recompute each head group in the backward; memory_budget (bytes, None: the
    kernel's ``default_memory_budget``, 64 MiB for ``impl="auto"``, else none): a call whose backward would keep
    more than this (``flow.kept_bytes``) runs as ``recompute=True`` does, when its steps allow it.
    """

    embed_dim: int
    num_heads: int
    bias: bool = True
    kdim: int | None = None
    vdim: int | None = None
    dropout: float = 0.0
    dtype: np.dtype = field(default=np.dtype(np.float64))
    head_dim: int | None = None
    scale: float | None = None
    num_kv_heads: int | None = None
    qk_norm: bool = False
    qk_norm_eps: float = 1e-6
    rope_theta: float | None = None
    alibi: bool = False
    rel_pos_max_distance: int | None = None
    add_bias_kv: bool = False
    add_zero_attn: bool = False
    softcap: float | None = None
    sinks: bool = False
    diff_attention: bool = False
    diff_layer_idx: int = 0
    diff_norm_eps: float = 1e-5
    recompute: bool = False
    memory_budget: int | None = None

    def __post_init__(self) -> None:
        E = _positive_int(self.embed_dim, "embed_dim")
        H = _positive_int(self.num_heads, "num_heads")
        if self.head_dim is None and E % H != 0:
            raise ValueError(f"embed_dim={E} is not divisible by num_heads={H} (or give head_dim)")
        d = E // H if self.head_dim is None else _positive_int(self.head_dim, "head_dim")
        R = self.rel_pos_max_distance
        if R is not None and (isinstance(R, bool) or not isinstance(R, (int, np.integer)) or R < 0):
            raise ValueError(f"rel_pos_max_distance must be a non-negative int or None, got {R!r}")
        resolved = dict(
            embed_dim=E, num_heads=H, num_kv_heads=_kv_heads(self.num_kv_heads, H),
            kdim=E if self.kdim is None else _positive_int(self.kdim, "kdim"),
            vdim=E if self.vdim is None else _positive_int(self.vdim, "vdim"),
            head_dim=d, scale=_positive_or_none(self.scale, "scale"),
            rope_theta=_rope_theta(self.rope_theta, d), rel_pos_max_distance=None if R is None else int(R),
            dtype=as_float_dtype(self.dtype), dropout=check_probability(self.dropout, "dropout"),
            softcap=_positive_or_none(self.softcap, "softcap"),
            qk_norm_eps=_positive_or_none(self.qk_norm_eps, "qk_norm_eps"),
            diff_layer_idx=_non_negative_int(self.diff_layer_idx, "diff_layer_idx"),
            diff_norm_eps=_positive_or_none(self.diff_norm_eps, "diff_norm_eps"),
            memory_budget=None if (m := self.memory_budget) is None else _non_negative_int(m, "memory_budget"),
            **{name: _flag(getattr(self, name), name) for name in
               ("bias", "qk_norm", "alibi", "add_bias_kv", "add_zero_attn", "sinks", "diff_attention", "recompute")},
        )  # fmt: skip
        _diff_kv_heads(resolved["diff_attention"], resolved["num_kv_heads"])
        for name, value in resolved.items():
            object.__setattr__(self, name, value)

    @property
    def q_dim(self) -> int:
        """H · d, the width of the query projection and of the merged heads (E unless head_dim is given)."""
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Ekv = Hkv · d, the width of the key and value projections."""
        return self.num_kv_heads * self.head_dim

    @property
    def merged_dim(self) -> int:
        """The merged heads' width, W_o's columns (``OutProject``): H · d here, H · dv in MLA (``latent_steps``)."""
        return self.q_dim

    @property
    def diff_lambda_init(self) -> float:
        """λ_init = 0.8 − 0.6 · exp(−0.3 · diff_layer_idx): differential attention's λ when its vectors are 0."""
        return 0.8 - 0.6 * math.exp(-0.3 * self.diff_layer_idx)

    def changed(self) -> dict:
        """The options that differ from their defaults (for ``repr``), in declaration order."""
        defaults = AttentionConfig(self.embed_dim, self.num_heads, kdim=self.kdim, vdim=self.vdim)
        return {
            f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) != getattr(defaults, f.name)
        }


# --------------------------------------------------------------------------- parameters


def _zeros(shape):
    return lambda rng, dtype: np.zeros(shape, dtype=dtype)


@dataclass(frozen=True)
class Param:
    """One parameter a step owns.

    heads: how it divides over heads, for ``recompute=True``'s head groups: "q" (its ``axis`` runs over the query
    heads, a slice per head), "kv" (over the key/value heads), "first" (not per head, used once: the output bias,
    added by the first group), None (shared by every head: the groups' gradients are summed).
    rank: the order of initialisation: 0 the projections' weights (in the order torch draws them), 1 biases, 2 a
    step's own parameters, in the order of the data path. init(rng, dtype) -> the initial array.
    """

    shape: tuple[int, ...]
    heads: str | None
    axis: int = 0
    init: object = None
    rank: int = 2


def _xavier_uniform(shape, fan_in: int, fan_out: int):
    bound = math.sqrt(6.0 / (fan_in + fan_out))
    return lambda rng, dtype: rng.uniform(-bound, bound, size=shape).astype(dtype)


# --------------------------------------------------------------------------- the steps


class Step:
    """Base of every step: what a step declares, and the defaults (no parameters, nothing to check)."""

    option = None  # the option that puts the step in the data path (None: always there)
    names: tuple[str, ...] = ()  # its caches in MHACache.steps
    groupwise = True  # it can run on one group of heads alone (recompute=True)
    not_groupwise = ""  # why not, when it cannot
    decodes = True  # it can run on a call that appends to a KV cache
    not_decodes = ""  # why not, when it cannot
    with_dropout = True  # it can run with dropout on the attention weights
    not_with_dropout = ""  # why not, when it cannot
    differentiable = True
    appended = 0  # keys it appends after the sequence's own (they get no mask and no score bias)

    def __init__(self, config: AttentionConfig) -> None:
        self.c = config

    def params(self) -> dict[str, Param]:
        return {}

    def check(self, f) -> None:
        """Check the call's arguments this step reads; ValueError naming them, before any arithmetic."""

    def forward(self, f, s: dict) -> None:  # pragma: no cover - the protocol
        raise NotImplementedError

    def backward(self, g, s: dict) -> None:  # pragma: no cover - the protocol
        raise NotImplementedError

    def recompute(self, f, s: dict) -> None:
        """Fill ``s`` with what ``backward`` needs, recomputed (activation checkpointing): the forward itself."""
        self.forward(f, s)

    def describe(self) -> str:
        return (self.__doc__ or type(self).__name__).strip().splitlines()[0]

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class Project(Step):
    """q = query W_qᵀ + b_q, k = key W_kᵀ + b_k, v = value W_vᵀ + b_v (self-attention: one GEMM)."""

    names = ("qkv_proj", "q_proj", "k_proj", "v_proj")

    def params(self):
        c = self.c
        E, Eq, Ekv = c.embed_dim, c.q_dim, c.kv_dim
        packed = c.kdim == c.vdim == Eq == Ekv == E  # torch initialises the packed (3E, E) in_proj_weight
        fan_out = 3 * E if packed else Eq
        out = {
            "W_q": Param((Eq, E), "q", init=_xavier_uniform((Eq, E), E, fan_out), rank=0),
            "W_k": Param((Ekv, c.kdim), "kv", init=_xavier_uniform((Ekv, c.kdim), c.kdim, fan_out), rank=0),
            "W_v": Param((Ekv, c.vdim), "kv", init=_xavier_uniform((Ekv, c.vdim), c.vdim, fan_out), rank=0),
        }
        if c.bias:
            out.update({name: Param((n,), heads, init=_zeros((n,)), rank=1)
                        for name, n, heads in (("b_q", Eq, "q"), ("b_k", Ekv, "kv"), ("b_v", Ekv, "kv"))})  # fmt: skip
        return out

    def forward(self, f, s):
        P, mm = f.P, f.matmul
        if f.self_attention:  # query is key is value: one GEMM over the stacked weights
            biases = [P["b_q"], P["b_k"], P["b_v"]] if self.c.bias else None
            (f.q, f.k, f.v), s["qkv_proj"] = F.fused_linear_forward(
                f.query, [P["W_q"], P["W_k"], P["W_v"]], biases, mm, check=False
            )  # F1: (B, L, E), (B, L, Ekv), (B, L, Ekv)
        else:
            f.q, s["q_proj"] = F.linear_forward(f.query, P["W_q"], P.get("b_q"), mm, check=False)  # F1: (B, Lq, E)
            f.k, s["k_proj"] = F.linear_forward(f.key, P["W_k"], P.get("b_k"), mm, check=False)  # F2: (B, Lk, Ekv)
            f.v, s["v_proj"] = F.linear_forward(f.value, P["W_v"], P.get("b_v"), mm, check=False)  # F3: (B, Lk, Ekv)

    def backward(self, g, s):
        G, mm = g.P, g.matmul
        if "qkv_proj" in s:
            (g.query, g.key, g.value), dWs, dbs = F.fused_linear_backward([g.q, g.k, g.v], s["qkv_proj"], mm)  # ← F1
            G["W_q"], G["W_k"], G["W_v"] = dWs  # (E, E), (Ekv, E), (Ekv, E)
            G["b_q"], G["b_k"], G["b_v"] = dbs if dbs is not None else (None, None, None)
        else:
            g.query, G["W_q"], G["b_q"] = F.linear_backward(g.q, s["q_proj"], mm)  # ← F1: (B, Lq, E)
            g.key, G["W_k"], G["b_k"] = F.linear_backward(g.k, s["k_proj"], mm)  # ← F2: (B, Lk, kdim)
            g.value, G["W_v"], G["b_v"] = F.linear_backward(g.v, s["v_proj"], mm)  # ← F3: (B, Lk, vdim)


class Split(Step):
    """Q (B, H, Lq, d), K, V (B, Hkv, Lk, d): head h reads features h·d ... (h+1)·d - 1."""

    names = ("q_split", "k_split", "v_split")

    def forward(self, f, s):
        f.Q, s["q_split"] = F.split_heads_forward(f.q, f.H, check=False)  # F1: (B, H, Lq, d)
        f.K, s["k_split"] = F.split_heads_forward(f.k, f.Hkv, check=False)  # F2: (B, Hkv, Lk, d)
        f.V, s["v_split"] = F.split_heads_forward(f.v, f.Hkv, check=False)  # F3: (B, Hkv, Lk, d)

    def backward(self, g, s):
        g.q = F.split_heads_backward(g.Q, s["q_split"])  # ← F1: (B, Lq, E)
        g.k = F.split_heads_backward(g.K, s["k_split"])  # ← F2: (B, Lk, Ekv)
        g.v = F.split_heads_backward(g.V, s["v_split"])  # ← F3: (B, Lk, Ekv)


class QKNorm(Step):
    """Q and K normalised per head by RMSNorm with learned weights q_norm, k_norm (d,), before RoPE (Qwen3)."""

    option = "qk_norm"
    names = ("q_norm", "k_norm")

    def params(self):
        d = self.c.head_dim  # shared by every head: recompute's groups add their gradients
        return {name: Param((d,), None, init=lambda rng, dtype: np.ones(d, dtype)) for name in self.names}

    def forward(self, f, s):
        f.Q, s["q_norm"] = F.rms_norm_forward(f.Q, f.P["q_norm"], self.c.qk_norm_eps, check=False)  # F1: (B, H, Lq, d)
        f.K, s["k_norm"] = F.rms_norm_forward(f.K, f.P["k_norm"], self.c.qk_norm_eps, check=False)  # F2

    def backward(self, g, s):
        g.K, g.P["k_norm"] = F.rms_norm_backward(g.K, s["k_norm"])  # ← F2
        g.Q, g.P["q_norm"] = F.rms_norm_backward(g.Q, s["q_norm"])  # ← F1


class Rope(Step):
    """Q, K turned pair by pair by the angles of their positions (RoPE, Hugging Face Llama's convention)."""

    option = "rope_theta"
    names = ("q_rope", "k_rope")

    def check(self, f):
        if f.positions is not None:
            if f.Lq != f.Lk:
                raise ValueError(f"positions= is for self-attention: query length {f.Lq} and key length {f.Lk} differ")
            F.check_positions(f.positions, f.B, f.Lq)

    def forward(self, f, s):
        f.Q, s["q_rope"] = F.rope_forward(f.Q, f.pos_q, self.c.rope_theta, check=False)  # F1: (B, H, Lq, d)
        f.K, s["k_rope"] = F.rope_forward(f.K, f.pos_k, self.c.rope_theta, check=False)  # F2: (B, Hkv, Lk, d)

    def backward(self, g, s):
        g.Q = F.rope_backward(g.Q, s["q_rope"])  # ← F1: the inverse rotation
        g.K = F.rope_backward(g.K, s["k_rope"])  # ← F2


class AppendToCache(Step):
    """K, V appended to the KV cache; the queries attend to every cached position, causally among themselves.

    With a ``StreamingKVCache`` (StreamingLLM) the queries attend to its sink tokens and window (the cache's mask),
    and the step comes before RoPE, which then turns every key at its place in the cache (``build_steps``)."""

    option = "kv_cache"
    names = ("kv_cache",)
    groupwise = False
    not_groupwise = "decoding keeps every head's K and V, recompute keeps none"
    differentiable = False
    cache_type = KVCache  # what kv_cache must be (MLA's AppendLatent: a LatentCache)

    def check(self, f):
        cache, kind = f.kv_cache, self.cache_type.__name__
        if not isinstance(cache, self.cache_type):
            raise ValueError(f"kv_cache must be a {kind} (from mha_numpy import {kind}), got {type(cache).__name__}")
        if f.Lq != f.Lk:
            raise ValueError(f"kv_cache is for self-attention: query length {f.Lq} and key length {f.Lk} must be equal")
        if f.positions is not None and not cache.takes_positions:
            raise ValueError(f"positions= with a {type(cache).__name__}: its positions are the places in the cache")
        cache.bind(f.owner, self.c.dtype, f.B)
        f.cached = len(cache)  # the positions before this call's

    def forward(self, f, s):
        s["kv_cache"] = len(f.kv_cache)  # F1: the number of positions cached before the call
        array = f.args.mask is not None and not isinstance(f.args.mask, masks.StructuredMask)
        allowed = f.kv_cache.mask(f.Q.shape[2], structured=not array)  # F1: (Lq, cached + Lq), its rule, or None
        self.store(f)  # F1: every position the queries see, (B, Hkv, cached + Lq, ·)
        if f.kv_cache.stores == "keys before RoPE":
            f.pos_k = np.arange(f.K.shape[2])  # RoPE, next, turns each key at its place in the cache
        if allowed is not None:
            f.args = replace(f.args, mask=masks.combine_masks(f.args.mask, allowed))  # F1

    def store(self, f):
        f.K, f.V = f.kv_cache.append(f.K, f.V)  # (B, Hkv, cached + Lq, d)

    def backward(self, g, s):  # pragma: no cover - build_steps refuses a backward through the cache
        raise ValueError("backward through a call with kv_cache is not supported: the cache is state (forward only)")


class RelativeBias(Step):
    """A learned bias per head and clipped distance j - i, added to the scores (T5-style; the table: rel_bias)."""

    option = "rel_pos_max_distance"
    names = ("rel_bias",)
    decodes = False
    not_decodes = "the table's bias is made per call, for the call's own keys"

    def params(self):
        shape = (self.c.num_heads, 2 * self.c.rel_pos_max_distance + 1)
        return {"rel_bias": Param(shape, "q", init=lambda rng, dtype: rng.normal(0.0, 1.0, size=shape).astype(dtype))}

    def forward(self, f, s):
        Lq, Lk, table = f.Q.shape[2], f.K.shape[2], f.P["rel_bias"]
        bias, s["rel_bias"] = F.relative_position_bias_forward(table, Lq, Lk, check=False)  # F1: (1, H, Lq, Lk)
        f.args = f.args.add_bias(bias)  # F2: added to the scores by the kernel

    def backward(self, g, s):
        g.P["rel_bias"] = F.relative_position_bias_backward(g.bias, s["rel_bias"])  # ← F2, F1: (H, 2R + 1)


class Alibi(Step):
    """ALiBi: a fixed penalty -m_h · distance per head added to the scores (no parameter, no gradient)."""

    option = "alibi"

    def forward(self, f, s):
        Lq, Lk = f.Q.shape[2], f.K.shape[2]
        bias = F.alibi_bias(self.c.num_heads, Lq, Lk, offset=Lk - Lq, dtype=self.c.dtype)  # (1, H, Lq, Lk)
        f.args = f.args.add_bias(bias[:, f.heads])  # F1: this flow's heads' slopes

    def backward(self, g, s):
        pass  # a constant: nothing to differentiate


class SoftCap(Step):
    """Soft-capped scores, cap · tanh(s / cap), inside the kernel after the score terms, before the mask (Gemma 2)."""

    option = "softcap"

    def forward(self, f, s):
        cap = ScoreMod("soft_cap", partial(F.soft_cap_forward, cap=self.c.softcap), F.soft_cap_backward)
        f.args = f.args.add_score_mod(cap)  # F1: every kernel applies it to the blocks of scores it holds

    def backward(self, g, s):
        pass  # ← F1: the kernel's backward takes dS through the cap's backward


class Sinks(Step):
    """A learned logit per head in every row's softmax denominator, weight that goes to no key (gpt-oss's sinks)."""

    option = "sinks"

    def params(self):
        H = self.c.num_heads  # one per query head: recompute's groups take their heads' slice
        return {"sinks": Param((H,), "q", init=lambda rng, dtype: rng.normal(0.0, 0.02, size=H).astype(dtype))}

    def forward(self, f, s):
        f.args = f.args.with_sinks(f.P["sinks"])  # F1: every kernel starts each row's softmax from it

    def backward(self, g, s):
        g.P["sinks"] = g.sinks  # ← F1: the kernel's backward returns its gradient


class BiasKV(Step):
    """A learned key bias_k and value bias_v appended after the sequence's keys (torch MHA's add_bias_kv)."""

    option = "add_bias_kv"
    names = ("bias_k", "bias_v")
    appended = 1

    def params(self):
        Ekv, std = self.c.kv_dim, 1.0 / math.sqrt(self.c.embed_dim)  # torch: xavier_normal_ of a (1, 1, E) tensor
        return {name: Param((Ekv,), "kv", init=lambda rng, dtype: rng.normal(0.0, std, size=Ekv).astype(dtype))
                for name in ("bias_k", "bias_v")}  # fmt: skip

    def forward(self, f, s):
        Lk, d = f.K.shape[2], self.c.head_dim
        bias_k = f.P["bias_k"].reshape(f.Hkv, 1, d)  # (Hkv·d,) -> (Hkv, 1, d): one extra position per head
        bias_v = f.P["bias_v"].reshape(f.Hkv, 1, d)
        f.K, s["bias_k"] = F.append_positions_forward(f.K, bias_k)  # F1: (B, Hkv, Lk + 1, d)
        f.V, s["bias_v"] = F.append_positions_forward(f.V, bias_v)  # F2: (B, Hkv, Lk + 1, d)
        f.args = f.args.append_keys(Lk, 1)  # F3: every query may attend to it, no score bias reaches it

    def backward(self, g, s):
        g.bias = None if g.bias is None else g.bias[..., :-1]  # ← F3: the appended column's bias was 0, not a term
        g.V, d_bias_v = F.append_positions_backward(g.V, s["bias_v"])  # ← F2: (B, Hkv, Lk, d), (Hkv, 1, d)
        g.K, d_bias_k = F.append_positions_backward(g.K, s["bias_k"])  # ← F1
        g.P["bias_k"], g.P["bias_v"] = d_bias_k.reshape(-1), d_bias_v.reshape(-1)  # (Hkv·d,)


class ZeroAttn(Step):
    """A zero key and a zero value appended after the keys (torch MHA's add_zero_attn): somewhere to put weight."""

    option = "add_zero_attn"
    names = ("zero_k", "zero_v")
    appended = 1

    def forward(self, f, s):
        Lk, zero = f.K.shape[2], np.zeros((1, 1, self.c.head_dim), dtype=f.K.dtype)  # (1, 1, d), every head
        f.K, s["zero_k"] = F.append_positions_forward(f.K, zero)  # F1: (B, Hkv, Lk + 1, d)
        f.V, s["zero_v"] = F.append_positions_forward(f.V, zero)  # F2: (B, Hkv, Lk + 1, d)
        f.args = f.args.append_keys(Lk, 1)  # F3

    def backward(self, g, s):
        g.bias = None if g.bias is None else g.bias[..., :-1]  # ← F3
        g.V = F.append_positions_backward(g.V, s["zero_v"])[0]  # ← F2: the zero position has nothing to learn
        g.K = F.append_positions_backward(g.K, s["zero_k"])[0]  # ← F1


_DIFF_NOT_GROUPWISE = (
    "its groups hold one key/value head each, and a pair does not fit in one: its query heads h and h + H/2 read "
    "key/value heads h // (H/Hkv) and h // (H/Hkv) + Hkv/2, whose values it joins"
)


class DiffValues(Step):
    """Differential attention's values: key/value heads j and j + Hkv/2 side by side (B, Hkv, Lk, 2d), for both maps."""

    option = "diff_attention"
    names = ("diff_values",)
    groupwise = False
    not_groupwise = _DIFF_NOT_GROUPWISE

    def forward(self, f, s):
        f.V, s["diff_values"] = F.diff_values_forward(f.V, check=False)  # F1: (B, Hkv, Lk, 2d)

    def backward(self, g, s):
        g.V = F.diff_values_backward(g.V, s["diff_values"])  # ← F1: (B, Hkv, Lk, d)


class DiffCombine(Step):
    """Heads p and p + H/2 as one: (1 − λ_init) · RMSNorm(C_p − λ C_{p+H/2}), λ = e^(λq1·λk1) − e^(λq2·λk2) + λ_init."""

    option = "diff_attention"
    names = ("diff_lambda", "diff_combine")
    groupwise = False
    not_groupwise = _DIFF_NOT_GROUPWISE
    with_dropout = False
    not_with_dropout = "the paper defines no dropout of two subtracted maps (Hugging Face DiffLlama refuses it too)"

    def params(self):
        d = self.c.head_dim  # shared by every head; DiffLlama draws them from N(0, lambda_std_dev² = 0.1²)
        init = lambda rng, dtype: rng.normal(0.0, 0.1, d).astype(dtype)  # noqa: E731
        return {name: Param((d,), None, init=init) for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2")}

    def forward(self, f, s):
        P, c = f.P, self.c
        lambdas = P["lambda_q1"], P["lambda_k1"], P["lambda_q2"], P["lambda_k2"]  # (d,) each
        lam, s["diff_lambda"] = F.diff_lambda_forward(*lambdas, c.diff_lambda_init, check=False)  # F1: ()
        f.context, s["diff_combine"] = F.diff_combine_forward(
            f.context, lam, c.diff_lambda_init, c.diff_norm_eps, check=False
        )  # F2: (B, H, Lq, 2d) -> (B, H/2, Lq, 2d)

    def backward(self, g, s):
        g.context, d_lam = F.diff_combine_backward(g.context, s["diff_combine"])  # ← F2: (B, H, Lq, 2d), ()
        d_q1, d_k1, d_q2, d_k2 = F.diff_lambda_backward(d_lam, s["diff_lambda"])  # ← F1: (d,) each
        g.P["lambda_q1"], g.P["lambda_k1"], g.P["lambda_q2"], g.P["lambda_k2"] = d_q1, d_k1, d_q2, d_k2


class RepeatKV(Step):
    """Each key/value head shared by H / Hkv query heads (grouped-query attention; nothing to do when Hkv = H)."""

    names = ("k_repeat", "v_repeat")

    def forward(self, f, s):
        n_rep = f.H // f.Hkv
        if n_rep == 1:
            f.K_heads, f.V_heads = f.K, f.V  # every query head has its own key/value head
            return
        f.K_heads, s["k_repeat"] = F.repeat_kv_forward(f.K, n_rep, check=False)  # F1: (B, H, Lk, d)
        f.V_heads, s["v_repeat"] = F.repeat_kv_forward(f.V, n_rep, check=False)  # F2: (B, H, Lk, d)

    def backward(self, g, s):
        if "k_repeat" not in s:
            g.K, g.V = g.K_heads, g.V_heads
            return
        g.V = F.repeat_kv_backward(g.V_heads, s["v_repeat"])  # ← F2: (B, Hkv, Lk, d), the sum over each group
        g.K = F.repeat_kv_backward(g.K_heads, s["k_repeat"])  # ← F1


class Attend(Step):
    """context = softmax(Q Kᵀ · scale + score terms + mask) V, by the call's kernel (mha_numpy.kernels)."""

    def forward(self, f, s):
        f.context, f.attention = f.kernel.run(f.Q, f.K_heads, f.V_heads, f.args)  # F1: (B, H, Lq, dv)

    def backward(self, g, s):
        g.Q, g.K_heads, g.V_heads, g.bias, g.sinks = g.kernel.backward(g.context, g.attention)  # ← F1


class Merge(Step):
    """merged (B, Lq, H·dv): the heads' contexts side by side (the inverse of the split; dv = d but in MLA)."""

    names = ("merge",)

    def forward(self, f, s):
        f.merged, s["merge"] = F.merge_heads_forward(f.context, check=False)  # F1: (B, Lq, E)

    def backward(self, g, s):
        g.context = F.merge_heads_backward(g.merged, s["merge"])  # ← F1: (B, H, Lq, d)


class OutProject(Step):
    """output = merged W_oᵀ + b_o."""

    names = ("out_proj",)

    def params(self):
        E, Eq = self.c.embed_dim, self.c.merged_dim
        bound = 1.0 / math.sqrt(Eq)  # torch's Linear(Eq, E): U(±1/√fan_in)
        init = lambda rng, dtype: rng.uniform(-bound, bound, size=(E, Eq)).astype(dtype)  # noqa: E731
        out = {"W_o": Param((E, Eq), "q", axis=1, rank=0, init=init)}
        if self.c.bias:
            out["b_o"] = Param((E,), "first", init=_zeros((E,)), rank=1)
        return out

    def forward(self, f, s):
        f.output, s["out_proj"] = F.linear_forward(f.merged, f.P["W_o"], f.P.get("b_o"), f.matmul, check=False)  # F1

    def recompute(self, f, s):
        s["out_proj"] = F.linear_cache(f.merged, f.P["W_o"], f.P.get("b_o"))  # what ← F1 needs, without the product

    def backward(self, g, s):
        g.merged, g.P["W_o"], g.P["b_o"] = F.linear_backward(g.output, s["out_proj"], g.matmul)  # ← F1: (B, Lq, E)


# --------------------------------------------------------------------------- the builder


def build_steps(c: AttentionConfig, kv_cache: bool | str = False) -> tuple[Step, ...]:
    """The steps of one call, in forward order: the only place the options meet and a combination is refused.

    kv_cache: the call appends to a ``KVCache`` (a call argument, not an option of the module): True or what the
    cache ``stores``, "keys after RoPE" (``KVCache``) or "keys before RoPE" (``StreamingKVCache``: appended before
    RoPE, which then turns every key at its place in the cache).
    """
    steps = [Project(c), Split(c)]
    if c.qk_norm:
        steps.append(QKNorm(c))
    if kv_cache == "keys before RoPE":
        steps.append(AppendToCache(c))
    if c.rope_theta is not None:
        steps.append(Rope(c))
    if kv_cache and kv_cache != "keys before RoPE":
        steps.append(AppendToCache(c))
    if c.rel_pos_max_distance is not None:
        steps.append(RelativeBias(c))
    if c.alibi:
        steps.append(Alibi(c))
    if c.softcap is not None:
        steps.append(SoftCap(c))
    if c.sinks:
        steps.append(Sinks(c))
    if c.add_bias_kv:
        steps.append(BiasKV(c))
    if c.add_zero_attn:
        steps.append(ZeroAttn(c))
    if c.diff_attention:
        steps.append(DiffValues(c))
    steps += [RepeatKV(c), Attend(c)]
    if c.diff_attention:
        steps.append(DiffCombine(c))
    steps += [Merge(c), OutProject(c)]
    return check_plan(c, steps, kv_cache)


def check_plan(c, steps, kv_cache: bool) -> tuple[Step, ...]:
    """The refusals, by what each step declares it can do (every builder's last line: ``build_steps`` and MLA's
    ``latent_steps.build_latent_steps``) -> the steps as a tuple."""
    for step in steps:
        if c.recompute and not step.groupwise:
            raise ValueError(f"{step.option} with recompute=True is not supported: {step.not_groupwise}")
        if kv_cache and not step.decodes:
            raise ValueError(f"kv_cache with {step.option} is not supported: {step.not_decodes}")
        if c.dropout and not step.with_dropout:
            raise ValueError(f"{step.option} with dropout={c.dropout:g} is not supported: {step.not_with_dropout}")
    return tuple(steps)


def describe(c: AttentionConfig, steps) -> str:
    """The plan as text: one numbered line per step, its cache names, and the parameters it owns."""
    lines = [f"the data path of {c.embed_dim}-wide attention with {c.num_heads} heads ({len(steps)} steps):"]
    for i, step in enumerate(steps, 1):
        lines.append(f"{i:3d} {type(step).__name__:<13} {step.describe()}")
        own = ", ".join(f"{name} {p.shape}" for name, p in step.params().items())
        if own:
            lines.append(f"{'':18}params: {own}")
    return "\n".join(lines)
