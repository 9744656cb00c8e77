"""The data path of ``MultiHeadAttention`` as data: its options, its steps, and the one function that builds the
step list of a call from the options (``build_steps``).

    Project     q, k, v = query W_qᵀ + b_q, key W_kᵀ + b_k, value W_vᵀ + b_v    (B, Lq, E), (B, Lk, Ekv) × 2
    Split       Q (B, H, Lq, d), K, V (B, Hkv, Lk, d)
    [GateQuery] Q (B, H, Lq, d): each head's first half of q's 2d features, the second its gate (Qwen3-Next)
    [QKNorm]    Q, K normalised per head (RMSNorm with learned weights; without them: Llama 4's)
    [VNorm]     V normalised per head (RMSNorm without weights: Gemma 3n)
    [Rope]      Q, K turned by the angles of their positions (the first int(d · partial_rotary_factor) features;
                rope_scaling's table; pairs (i, i + n) or, rope_interleave, (2i, 2i + 1))
    [AppendToCache]  K, V appended to the KV cache: (B, Hkv, cached + Lk, d), causal within the call
    [ShareKV]   K, V kept for later layers ("store") or read from an earlier one ("reuse"; Gemma 3n)
    [HeadTemperature]  the scores · exp(t_h), a learned temperature per head      } score terms: ``ScoreTerm``s,
    [LogLengthScale] each query's scores · (log(⌊(p + 1) / floor⌋ + 1) · scale + 1) at its position p (Llama 4)
    [RelativeBias]   a learned term for the scores, by head and clipped distance   } applied by every kernel to the
    [Alibi]     a fixed term for the scores, by head and distance                  } blocks of scores it holds
    [SoftCap]   the scores capped, cap · tanh(s / cap)                             } (the kernels' one score hook)
    [Sinks]     a learned logit per head in every row's softmax denominator, inside the kernel (gpt-oss)
    [BiasKV]    a learned key and value appended: (B, Hkv, Lk + 1, d)
    [ZeroAttn]  a zero key and value appended
    [DiffValues]     V: key/value heads j and j + Hkv/2 side by side, (B, Hkv, Lk, 2d) (differential attention)
    RepeatKV    K, V shared by the query heads: (B, H, Lk, d)
    Attend      context = softmax(Q Kᵀ · scale + score terms + mask) V, by the kernel    (B, H, Lq, d)
    [DiffCombine]    heads p and p + H/2: (1 − λ_init) · RMSNorm(C_p − λ C_{p+H/2}), (B, H/2, Lq, 2d)
    [OutputGate]     context · sigmoid(gate), the gate each head's second half of q (Qwen3-Next)
    Merge       merged (B, Lq, E)
    OutProject  output = merged W_oᵀ + b_o    (B, Lq, E)

E = embed_dim, H = num_heads, Hkv = num_kv_heads, d = E / H, Ekv = Hkv · d; steps in [brackets] are optional.
Latent attention (``kv_lora_rank``) has its own projection steps in place of Project ... RepeatKV
(``latent_steps.py``); the rest is the same.

A step is a small class, micrograd's rule applied: its forward travels with its backward.

    forward(f, s)   reads and writes the tensors of the flow ``f`` (``flow.Flow``: every tensor of a call by the
                    name used above) and keeps what its backward needs in ``s`` under its cache names
                    (``MHACache.steps``)
    backward(g, s)  ``g`` holds the gradients of the same names: it turns the gradients of what forward wrote into
                    the gradients of what forward read, its lines the forward's reversed (``# ← F1``)
    params()        the parameters it owns (``Param``: shape, initialisation, which axis runs over heads)
    check(f)        the checks of the call's arguments it reads, run before any arithmetic

and declares what it is: ``options`` (each option once, an ``Option``: default, check, exports, example), ``place``
(its place in the data path: ``build_steps`` sorts the registered steps by it), ``family`` ("mha" or "latent"
projections), ``reads`` and ``writes`` (the flow tensors: ``check_plan`` checks the order by them); and what it can
do: ``latent`` (it runs in latent attention; why not in ``not_latent``), ``groupwise`` (it runs on one group of
heads alone, which ``recompute=True`` needs; a step that cannot says why in ``not_groupwise``), ``decodes`` (it runs
on a call that appends to a KV cache; why not in ``not_decodes``), ``with_dropout`` (it runs with dropout on the
weights; why not in ``not_with_dropout``), ``differentiable`` (has a backward), ``appended`` (keys it adds after the
sequence's).
``build_steps`` refuses a combination by those declarations, naming both options.
``MultiHeadAttention`` checks the call, walks the list forwards and, in ``backward``, reversed (``flow.py``).
"""

from __future__ import annotations

import math
from collections import ChainMap
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial

import numpy as np

from . import functional as F
from . import masks
from . import rope_scaling as RS
from ._checks import as_bool, as_float_dtype, as_int, as_number, check_probability
from .kernels import ScoreMod
from .kv_cache import KVCache

# --------------------------------------------------------------------------- the options


@dataclass(frozen=True)
class Option:
    """One option of the module, declared once, on the step that reads it (``Step.options``).

    default: its value when not given.  check(value, name, o) -> the resolved value, or ValueError naming the
    option; ``o`` maps every option to its value so far (resolved for the ones declared before it, as given for
    the others).  exports: the exports that can express it when it is in effect ("torch_mha": ``to_torch_mha``);
    any other export refuses it, naming it.  requires: the option without which it has no effect (an eps without
    its norm).  example: the options that turn it on in a test ({} for a setting that changes no step: sizes,
    dtype); ``tests/test_option_pairs.py`` runs every pair of declared examples on every kernel, so a new option is
    tested with its neighbours with no test edit.  Everything else derives from these declarations:
    ``AttentionConfig``'s checks, ``repr``, the exporters' refusals, ``describe()`` and the combination tests.
    """

    default: object = None
    check: Callable | None = None
    exports: tuple = ()
    requires: str | None = None
    example: dict = field(default_factory=dict)


OPTIONS: dict[str, Option] = {}  # every declared option, in declaration order (the order they are resolved in)


def _size(value, name, o):
    return as_int(value, name, minimum=1)


def _size_or_none(value, name, o):
    return None if value is None else as_int(value, name, minimum=1)


def _count(value, name, o):
    return as_int(value, name, minimum=0)


def _count_or_none(value, name, o):
    return None if value is None else as_int(value, name, minimum=0)


def _flag(value, name, o):
    return as_bool(value, name)


def _positive(value, name, o, none: str = ""):
    number = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))
    if not number or not 0 < value < np.inf:  # None, inf and NaN refused, naming the option
        raise ValueError(f"{name} must be a positive finite number{none}, got {value!r}")
    return float(value)


def _positive_or_none(value, name, o):
    return None if value is None else _positive(value, name, o, none=" or None")


# --------------------------------------------------------------------------- the configuration


class AttentionConfig:
    """Every option of the data path, checked (``ValueError`` naming the option) and resolved (None -> its default),
    by the declarations of the steps (``OPTIONS``; ``describe_options()`` lists them).

    ``AttentionConfig(embed_dim, num_heads, bias=True, kdim=None, vdim=None, dropout=0.0, dtype=np.float64,
    **options)``; read an option as an attribute (``config.rope_theta``); ``config.replace(name=value)`` is a new,
    checked config; ``config.changed()`` the options in effect that differ from their defaults. Frozen.
    """

    def __init__(self, embed_dim, num_heads, bias=True, kdim=None, vdim=None, dropout=0.0, dtype=np.float64, **options):
        given = dict(embed_dim=embed_dim, num_heads=num_heads, bias=bias, kdim=kdim, vdim=vdim, dropout=dropout,
                     dtype=dtype, **options)  # fmt: skip
        unknown = sorted(set(given) - set(OPTIONS))
        if unknown:
            raise ValueError(f"unknown option {unknown[0]!r}; the options are {', '.join(list(OPTIONS)[7:])}")
        resolved: dict = {}
        o = ChainMap(resolved, given, {name: opt.default for name, opt in OPTIONS.items()})
        for name, opt in OPTIONS.items():  # in declaration order: a check reads the ones before it resolved
            resolved[name] = o[name] if opt.check is None else opt.check(o[name], name, o)
        self.__dict__.update(_values=resolved, _given=given)

    def __getattr__(self, name):
        values = self.__dict__.get("_values", {})
        if name in values:
            return values[name]
        raise AttributeError(f"'AttentionConfig' object has no attribute {name!r}")

    def __setattr__(self, name, value):
        raise AttributeError(f"AttentionConfig is frozen: config.replace({name}=...) makes a new one")

    def replace(self, **changes) -> AttentionConfig:
        """A new config with ``changes`` (checked again with every other option as given)."""
        return AttentionConfig(**{**self._given, **changes})

    def __eq__(self, other):
        return isinstance(other, AttentionConfig) and self._values == other._values

    def __hash__(self):
        return hash(tuple(self._values.items()))  # frozen: a key of a dict, as the dataclass of 0.3 was

    def __repr__(self) -> str:
        return f"AttentionConfig({', '.join(f'{k}={v!r}' for k, v in self._values.items())})"

    @property
    def latent(self) -> bool:
        """Multi-head latent attention (``kv_lora_rank`` given): the projections are MLA's (``latent_steps``)."""
        return self.kv_lora_rank is not None

    @property
    def q_dim(self) -> int:
        """H · d, the width of the query projection (E unless head_dim is given; H · dqk in MLA; 2 · H · d with
        output_gate: each head's [query | gate], Qwen3-Next's q_proj)."""
        return self.num_heads * self.head_dim * (2 if self.output_gate else 1)

    @property
    def qk_head_dim(self) -> int:
        """dqk, the query and key heads' width (``head_dim``; MLA's name: dn + dr)."""
        return self.head_dim

    @property
    def kv_dim(self) -> int:
        """Ekv = Hkv · d, the width of the key and value projections."""
        return self.num_kv_heads * self.head_dim

    @property
    def merged_dim(self) -> int:
        """The merged heads' width, W_o's columns (``OutProject``): H · d, H · dv in MLA."""
        return self.num_heads * (self.v_head_dim if self.latent else self.head_dim)

    @property
    def diff_lambda_init(self) -> float:
        """λ_init = 0.8 − 0.6 · exp(−0.3 · diff_layer_idx): differential attention's λ when its vectors are 0."""
        return 0.8 - 0.6 * math.exp(-0.3 * self.diff_layer_idx)

    def in_effect(self, name: str) -> bool:
        """Whether the option ``name`` changes the data path here: given, different from what its default resolves
        to, and its ``requires`` option in effect too."""
        opt = OPTIONS[name]
        if name not in self._given or (opt.requires and not self.in_effect(opt.requires)):
            return False
        try:
            default = AttentionConfig(**{**self._given, name: opt.default})._values[name]
        except ValueError:  # its default does not fit the others (head_dim where E / H is not whole)
            return True
        return self._values[name] != default

    def changed(self) -> dict:
        """The options in effect, by name, in declaration order (for ``repr`` and the exporters)."""
        return {name: self._values[name] for name in OPTIONS if self.in_effect(name)}

    def not_exportable(self, export: str) -> list[str]:
        """The options in effect that ``export`` ("torch_mha") cannot express, as "name=value" (their declarations'
        ``exports``); an exporter refuses the first, never passes it silently."""
        return [f"{k}={v}" for k, v in self.changed().items() if export not in OPTIONS[k].exports]


def describe_options() -> str:
    """Every option: its default, the step that declares it and the exports that can express it."""
    return "\n".join(
        f"{name:<22} default {opt.default!r:<10} {', '.join(opt.exports) or '(ours only)'}"
        for name, opt in OPTIONS.items()
    )


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

DATA_PATH: list = []  # every step class with a place, in the order they are defined (``Step.__init_subclass__``)


def _features(value, name, o):
    return o["embed_dim"] if value is None else as_int(value, name, minimum=1)  # kdim, vdim: None = E


def _head_dim(value, name, o):
    if o["kv_lora_rank"] is not None:  # latent attention: each query/key head is [nope | rope]
        if value is not None:
            raise ValueError("head_dim with kv_lora_rank: latent attention's heads are qk_nope_head_dim + "
                             "qk_rope_head_dim wide; give those")  # fmt: skip
        return as_int(o["qk_nope_head_dim"], "qk_nope_head_dim", 1) + as_int(
            o["qk_rope_head_dim"], "qk_rope_head_dim", 1
        )
    if value is not None:
        return as_int(value, name, minimum=1)
    E, H = o["embed_dim"], o["num_heads"]
    if E % H:
        raise ValueError(f"embed_dim={E} is not divisible by num_heads={H} (or give head_dim)")
    return E // H


def _kv_heads(value, name, o):
    H = o["num_heads"]
    Hkv = H if value is None else as_int(value, name, minimum=1)
    if H % Hkv:
        raise ValueError(f"num_heads={H} is not a multiple of num_kv_heads={Hkv}: each key/value head serves "
                         "num_heads // num_kv_heads query heads")  # fmt: skip
    if o["kv_lora_rank"] is not None and Hkv != H:
        raise ValueError(f"num_kv_heads={Hkv} with kv_lora_rank: latent attention expands every head's key and "
                         "value from the latent (num_kv_heads = num_heads)")  # fmt: skip
    return Hkv


def _rope_theta(value, name, o):
    if value is None:
        if o["kv_lora_rank"] is not None:
            raise ValueError("latent attention (kv_lora_rank) needs rope_theta: its decoupled rope key is turned")
        return None
    theta = as_number(value, name, positive=True)  # a finite number > 0, or ValueError naming rope_theta
    if o["kv_lora_rank"] is None and o["head_dim"] % 2:
        raise ValueError(f"rope_theta needs an even head dim (RoPE turns pairs of features): head dim {o['head_dim']}")
    return theta


def _diff_attention(value, name, o):
    if as_bool(value, name) and o["num_kv_heads"] % 2:
        raise ValueError(
            f"diff_attention needs an even num_kv_heads (key/value heads j and j + Hkv/2 make a pair's keys and "
            f"values, as in Hugging Face DiffLlama), got num_kv_heads={o['num_kv_heads']}"
        )
    return bool(value)


def _output_gate(value, name, o):
    if as_bool(value, name) and o["diff_attention"]:
        raise ValueError("output_gate with diff_attention is not supported: the gate has one half-head per query "
                         "head, and differential attention joins heads p and p + H/2 into one")  # fmt: skip
    return bool(value)


def _partial_rotary_factor(value, name, o):
    factor = _positive(value, name, o)
    if factor > 1:
        raise ValueError(f"{name} must be in (0, 1], the fraction of each head RoPE turns, got {value!r}")
    if factor != 1 and o["kv_lora_rank"] is not None:
        raise ValueError(f"{name}={value!r} with kv_lora_rank: latent attention turns its qk_rope_head_dim part; "
                         "give that")  # fmt: skip
    turned = int(o["head_dim"] * factor)  # as Hugging Face: int(head_dim * partial_rotary_factor)
    if factor != 1 and o["rope_theta"] is not None and (turned < 2 or turned % 2):  # 1: all d, rope_theta's check
        raise ValueError(f"{name}={value!r} turns int({o['head_dim']} · {value!r}) = {turned} features of each "
                         "head: RoPE turns pairs, so it must be even and at least 2")  # fmt: skip
    return factor


def _rope_interleave(value, name, o):
    if value is None:  # the pairs' layout of the family: DeepSeek's MLA interleaved, Llama's half-split
        return o["kv_lora_rank"] is not None
    return as_bool(value, name)


def _rope_scaling(value, name, o):
    if value is None:
        return None
    if o["rope_theta"] is None:
        raise ValueError(f"{name} scales RoPE's frequencies: it needs rope_theta")
    latent = o["kv_lora_rank"] is not None  # MLA turns its qk_rope_head_dim part, all of it
    d, factor = (o["qk_rope_head_dim"], 1.0) if latent else (o["head_dim"], o["partial_rotary_factor"])
    return RS.check_rope_scaling(value, name, o["rope_theta"], d, factor)  # ValueError naming rope_scaling[field]


class Step:
    """Base of every step: what a step declares, and the defaults (no parameters, nothing to check)."""

    option = None  # the option that puts the step in the data path (None: always there)
    options: dict = {}  # the options it declares, by name (``Option``): each option is declared once, on one step
    place: int | None = None  # its place in the data path (``build_steps`` sorts by it); None: a base class
    family: str | None = None  # "mha" or "latent": the projections of one kind of attention; None: both kinds
    latent = True  # it works in multi-head latent attention (kv_lora_rank)
    not_latent = ""  # why not, when it does not
    reads: tuple[str, ...] = ()  # the flow tensors (``flow.Flow``'s fields) its forward reads ...
    writes: tuple[str, ...] = ()  # ... and writes: ``check_plan`` checks that some earlier step wrote each read
    names: tuple[str, ...] = ()  # its caches in MHACache.steps
    groupwise = True  # it can run on one group of heads alone (recompute=True)
    not_groupwise = ""  # why not, when it cannot
    decodes = True  # it can run on a call that appends to a KV cache
    not_decodes = ""  # why not, when it cannot
    with_dropout = True  # it can run with dropout on the attention weights
    not_with_dropout = ""  # why not, when it cannot
    differentiable = True
    appended = 0  # keys it appends after the sequence's own (they get no mask and no score bias)

    def __init_subclass__(cls, **kwargs) -> None:
        """Register what a step class declares: its options (``OPTIONS``) and, with a ``place``, the step itself
        (``DATA_PATH``, which ``build_steps`` reads): a new step is one class, and no list is edited by hand."""
        super().__init_subclass__(**kwargs)
        for name, opt in cls.__dict__.get("options", {}).items():
            if name in OPTIONS:
                raise TypeError(f"option {name!r} of {cls.__name__} is declared already; declare each option once")
            OPTIONS[name] = opt
        if cls.__dict__.get("place") is not None:
            DATA_PATH.append(cls)

    @classmethod
    def place_in(cls, c: AttentionConfig, kv_cache: bool | str) -> int | None:
        """Its place in the data path of a call with the options ``c`` (None: not in it): always, or when its
        option is set; only in its ``family`` of attention."""
        if cls.family is not None and cls.family != ("latent" if c.latent else "mha"):
            return None
        if cls.option is not None and getattr(c, cls.option) in (None, False):
            return None
        return cls.place

    def __init__(self, config: AttentionConfig) -> None:
        self.c = config

    def params(self) -> dict[str, Param]:
        """The parameters it owns, by name (``Param``: shape, initialisation, head layout); none by default."""
        return {}

    def check(self, f) -> None:
        """Check the call's arguments this step reads; ValueError naming them, before any arithmetic."""

    def forward(self, f, s: dict) -> None:  # pragma: no cover - the protocol
        """Read and write the tensors of the flow ``f``; keep what ``backward`` needs in ``s`` under ``names``."""
        raise NotImplementedError

    def backward(self, g, s: dict) -> None:  # pragma: no cover - the protocol
        """Turn the gradients of what ``forward`` wrote (in ``g``) into those of what it read, lines reversed."""
        raise NotImplementedError

    def recompute(self, f, s: dict) -> None:
        """Fill ``s`` with what ``backward`` needs, recomputed (activation checkpointing): the forward itself."""
        self.forward(f, s)

    def describe(self) -> str:
        """One line for ``describe()``: the first line of its docstring."""
        return (self.__doc__ or type(self).__name__).strip().splitlines()[0]

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class Project(Step):
    """q = query W_qᵀ + b_q, k = key W_kᵀ + b_k, v = value W_vᵀ + b_v (self-attention: one GEMM)."""

    reads, writes = ("query", "key", "value"), ("q", "k", "v")

    names = ("qkv_proj", "q_proj", "k_proj", "v_proj")
    place, family = 10, "mha"
    options = {
        "embed_dim": Option(None, _size, exports=("torch_mha",)),  # E
        "num_heads": Option(None, _size, exports=("torch_mha",)),  # H
        "bias": Option(True, _flag, exports=("torch_mha",)),  # the projections' biases
        "kdim": Option(None, _features, exports=("torch_mha",)),  # the key's features (None: E)
        "vdim": Option(None, _features, exports=("torch_mha",)),  # the value's features (None: E)
        "dtype": Option(np.float64, lambda v, n, o: as_float_dtype(v), exports=("torch_mha",)),
        "head_dim": Option(None, _head_dim),  # d (None: E / H); W_q (H·d, E), W_o (E, H·d) as Gemma's, Qwen3's
        "num_kv_heads": Option(
            None, _kv_heads, example={"num_kv_heads": 2}
        ),  # Hkv (None: H): grouped-query (1: multi-query) attention
    }

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
        if c.kv_sharing == "reuse":  # its keys and values are another layer's (ShareKV): no projections of its own
            out = {name: p for name, p in out.items() if name[-1] == "q"}
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
            if self.c.kv_sharing == "reuse":
                return  # K, V are another layer's: ShareKV reads them from the call's key and value
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
            if "k_proj" not in s:
                return  # kv_sharing="reuse": ShareKV gave the key's and value's gradients
            g.key, G["W_k"], G["b_k"] = F.linear_backward(g.k, s["k_proj"], mm)  # ← F2: (B, Lk, kdim)
            g.value, G["W_v"], G["b_v"] = F.linear_backward(g.v, s["v_proj"], mm)  # ← F3: (B, Lk, vdim)


class Split(Step):
    """Q (B, H, Lq, d), K, V (B, Hkv, Lk, d): head h reads features h·d ... (h+1)·d - 1."""

    reads, writes = ("q", "k", "v"), ("Q", "K", "V")

    names = ("q_split", "k_split", "v_split")
    place, family = 20, "mha"

    def forward(self, f, s):
        f.Q, s["q_split"] = F.split_heads_forward(f.q, f.H, check=False)  # F1: (B, H, Lq, d)
        if f.k is None:
            return  # kv_sharing="reuse": no keys or values of its own
        f.K, s["k_split"] = F.split_heads_forward(f.k, f.Hkv, check=False)  # F2: (B, Hkv, Lk, d)
        f.V, s["v_split"] = F.split_heads_forward(f.v, f.Hkv, check=False)  # F3: (B, Hkv, Lk, d)

    def backward(self, g, s):
        dq = F.split_heads_backward(g.Q, s["q_split"])  # ← F1: (B, Lq, E)
        g.q = dq if g.q is None else dq + g.q  # q read by OutputGate too (its gate): the gradients add
        if "k_split" not in s:
            return
        g.k = F.split_heads_backward(g.K, s["k_split"])  # ← F2: (B, Lk, Ekv)
        g.v = F.split_heads_backward(g.V, s["v_split"])  # ← F3: (B, Lk, Ekv)


class GateQuery(Step):
    """Each head's query: the first d of its 2d features, the rest its output gate (Qwen3-Next; see OutputGate)."""

    reads, writes = ("Q",), ("Q",)

    option = "output_gate"
    names = ("gate_query",)
    place = 25
    options = {"output_gate": Option(False, _output_gate, example={"output_gate": True})}
    latent = False
    not_latent = "latent attention's queries come from their own projections, with no gate half"

    def forward(self, f, s):
        f.Q, s["gate_query"] = F.gate_query_forward(f.Q, check=False)  # F1: (B, H, Lq, 2d) -> (B, H, Lq, d)

    def backward(self, g, s):
        g.Q = F.gate_query_backward(g.Q, s["gate_query"])  # ← F1: (B, H, Lq, 2d), 0 on the gate's half


class QKNorm(Step):
    """Q and K normalised per head by RMSNorm with learned weights q_norm, k_norm (d,), before RoPE (Qwen3).

    qk_norm_weight=False: without the weights, x · rsqrt(mean(x²) + eps) (Llama 4's ``Llama4TextL2Norm``, which it
    applies after RoPE: a rotation keeps each head's mean square, so without a weight the norm and RoPE commute and
    the order changes no number)."""

    reads, writes = ("Q", "K"), ("Q", "K")

    option = "qk_norm"
    names = ("q_norm", "k_norm")
    place = 30
    options = {
        "qk_norm": Option(False, _flag, example={"qk_norm": True}),
        "qk_norm_eps": Option(1e-6, _positive, requires="qk_norm"),
        "qk_norm_weight": Option(True, _flag, requires="qk_norm", example={"qk_norm": True, "qk_norm_weight": False}),
    }
    latent = False
    not_latent = "latent attention's queries and keys have RMSNorms of their own, on the latents"

    def params(self):
        d = self.c.head_dim  # shared by every head: recompute's groups add their gradients
        if not self.c.qk_norm_weight:
            return {}
        names = ("q_norm",) if self.c.kv_sharing == "reuse" else self.names  # reuse: the keys' source normed them
        return {name: Param((d,), None, init=lambda rng, dtype: np.ones(d, dtype)) for name in names}

    def weights(self, f):
        """q_norm, k_norm (d,): the learned ones, or ones (qk_norm_weight=False: x · 1 is x, exactly)."""
        if self.c.qk_norm_weight:
            return f.P["q_norm"], f.P.get("k_norm")
        ones = np.ones(self.c.head_dim, dtype=f.Q.dtype)
        return ones, ones

    def forward(self, f, s):
        w_q, w_k = self.weights(f)
        f.Q, s["q_norm"] = F.rms_norm_forward(f.Q, w_q, self.c.qk_norm_eps, check=False)  # F1: (B, H, Lq, d)
        if f.K is not None:  # kv_sharing="reuse": no keys of its own
            f.K, s["k_norm"] = F.rms_norm_forward(f.K, w_k, self.c.qk_norm_eps, check=False)  # F2: (B, Hkv, Lk, d)

    def backward(self, g, s):
        d_k_norm = None
        if "k_norm" in s:
            g.K, d_k_norm = F.rms_norm_backward(g.K, s["k_norm"])  # ← F2
        g.Q, d_q_norm = F.rms_norm_backward(g.Q, s["q_norm"])  # ← F1
        if self.c.qk_norm_weight:
            g.P["q_norm"], g.P["k_norm"] = d_q_norm, d_k_norm


class VNorm(Step):
    """V normalised per head by RMSNorm without a weight, x · rsqrt(mean(x²) + eps) (Gemma 3n's v_norm)."""

    reads, writes = ("V",), ("V",)

    option = "v_norm"
    names = ("v_norm",)
    place = 32
    options = {
        "v_norm": Option(False, _flag, example={"v_norm": True}),
        "v_norm_eps": Option(1e-6, _positive, requires="v_norm"),
    }
    latent = False
    not_latent = "latent attention's values are expanded from a latent with an RMSNorm of its own"

    def forward(self, f, s):
        if f.V is None:
            return  # kv_sharing="reuse": its values come normed from their layer
        ones = np.ones(f.V.shape[-1], dtype=f.V.dtype)  # no weight: x · 1 is x, exactly
        f.V, s["v_norm"] = F.rms_norm_forward(f.V, ones, self.c.v_norm_eps, check=False)  # F1: (B, Hkv, Lk, d)

    def backward(self, g, s):
        if "v_norm" in s:
            g.V = F.rms_norm_backward(g.V, s["v_norm"])[0]  # ← F1: the weight's gradient is not wanted


_PARTIAL = {"rope_theta": 50.0, "partial_rotary_factor": 0.5, "head_dim": 4}  # d = 4: 2 of 4 turned (d = 2: none)
_YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 2}  # the 2·pairs' mscale 1.14
_INTERLEAVED = {"rope_theta": 50.0, "rope_interleave": True, "head_dim": 4}  # d = 2: one pair, the same both ways


class Rope(Step):
    """Q, K turned pair by pair by the angles of their positions (RoPE, Hugging Face Llama's convention).

    The pairs (i, i + n), Llama's rotate_half, or with ``rope_interleave`` (2i, 2i + 1), GPT-J's and Llama 4's; the
    angles position · inv_freq[i] of ``rope_scaling``'s table (``mha_numpy/rope_scaling.py``), n = turned / 2."""

    reads, writes = ("Q", "K"), ("Q", "K")

    option = "rope_theta"
    names = ("q_rope", "k_rope")
    place, family = 40, "mha"
    options = {
        "rope_theta": Option(None, _rope_theta, example={"rope_theta": 50.0}),  # RoPE's base (MLA: its rope part's)
        # the fraction of each head turned, its first int(d · factor) features (Hugging Face's name and rule)
        "partial_rotary_factor": Option(1.0, _partial_rotary_factor, requires="rope_theta", example=_PARTIAL),
        # transformers' rope_parameters: the frequency table and attention factor of a rope_type (rope_scaling.py)
        "rope_scaling": Option(
            None, _rope_scaling, requires="rope_theta", example={"rope_theta": 50.0, "rope_scaling": _YARN}
        ),
        # the pairs: (2i, 2i + 1) (GPT-J, Llama 4; DeepSeek's MLA, its default there) or (i, i + n) (Llama)
        "rope_interleave": Option(None, _rope_interleave, requires="rope_theta", example=_INTERLEAVED),
    }

    def check(self, f):
        if f.positions is not None:
            if f.Lq != f.Lk and self.c.kv_sharing != "reuse":  # reuse: the queries' positions (K comes turned)
                raise ValueError(f"positions= is for self-attention: query length {f.Lq} and key length {f.Lk} differ")
            F.check_positions(f.positions, f.B, f.Lq)

    def table(self, f, head_dim=None, partial_rotary_factor=None):
        """The call's frequency table and attention factor (``rope_scaling.rope_frequencies``): n = turned / 2
        pairs of the first int(d · partial_rotary_factor) features (the whole head for rope_type "proportional");
        a length-dependent rope_type (dynamic, longrope) reads the largest position of the call + 1."""
        c = self.c
        seq_len = None
        if RS.reads_length(c.rope_scaling):
            seq_len = 1 + max((float(np.max(p)) for p in (f.pos_q, f.pos_k) if np.size(p)), default=-1.0)
        d = c.head_dim if head_dim is None else head_dim
        p = c.partial_rotary_factor if partial_rotary_factor is None else partial_rotary_factor
        return RS.rope_frequencies(c.rope_scaling, c.rope_theta, d, p, seq_len)

    def forward(self, f, s):
        (inv_freq, factor), pairs = self.table(f), self.c.rope_interleave  # (n,), n = turned / 2 (all: d / 2)
        f.Q, s["q_rope"] = F.rotary_forward(f.Q, f.pos_q, inv_freq, factor, pairs, check=False)  # F1: (B, H, Lq, d)
        if f.K is not None:  # kv_sharing="reuse": its keys come turned from their layer
            f.K, s["k_rope"] = F.rotary_forward(f.K, f.pos_k, inv_freq, factor, pairs, check=False)  # F2

    def backward(self, g, s):
        g.Q = F.rotary_backward(g.Q, s["q_rope"])  # ← F1: the inverse rotation
        if "k_rope" in s:
            g.K = F.rotary_backward(g.K, s["k_rope"])  # ← F2


class AppendToCache(Step):
    """K, V appended to the KV cache; the queries attend to every cached position, causally among themselves.

    With a ``StreamingKVCache`` (StreamingLLM) the queries attend to its sink tokens and window (the cache's mask),
    and the step comes before RoPE, which then turns every key at its place in the cache (``build_steps``)."""

    reads, writes = ("K", "V", "args"), ("K", "V", "args")

    option = "kv_cache"
    names = ("kv_cache",)
    place, family = 45, "mha"  # after RoPE; a cache that stores keys before RoPE: 35, before it
    groupwise = False
    not_groupwise = "decoding keeps every head's K and V, recompute keeps none"
    differentiable = False
    cache_type = (KVCache,)  # what kv_cache may be (MLA's AppendLatent: a LatentCache or a StreamingKVCache)

    @classmethod
    def place_in(cls, c, kv_cache):
        """A call with a KV cache (a call argument, not an option): after RoPE, or before it for a cache that keeps
        its keys unturned (``StreamingKVCache``: RoPE then turns every key at its place in the cache)."""
        if not kv_cache or cls.family != ("latent" if c.latent else "mha"):
            return None
        return cls.place - 10 if kv_cache == "keys before RoPE" else cls.place

    def check(self, f):
        cache, kind = f.kv_cache, " or a ".join(t.__name__ for t in self.cache_type)
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
        keys = self.store(f)  # F1: every position the queries see, (B, Hkv, cached + Lq, ·)
        if f.kv_cache.stores == "keys before RoPE":
            f.pos_k = np.arange(keys)  # RoPE, next, turns each key at its place in the cache
        if allowed is not None:
            f.args = replace(f.args, mask=masks.combine_masks(f.args.mask, allowed))  # F1

    def store(self, f):
        f.K, f.V = f.kv_cache.append(f.K, f.V)  # (B, Hkv, cached + Lq, d)
        return f.K.shape[2]  # the keys the queries see

    def backward(self, g, s):  # pragma: no cover - build_steps refuses a backward through the cache
        raise ValueError("backward through a call with kv_cache is not supported: the cache is state (forward only)")


def _kv_sharing(value, name, o):
    if value not in (None, "store", "reuse"):
        raise ValueError(f"{name} must be None, 'store' or 'reuse' (Gemma 3n's kv_sharing_modes), got {value!r}")
    return value


class ShareKV(Step):
    """K, V shared across layers (Gemma 3n): kept for later layers ("store") or read from an earlier one ("reuse").

    "store" takes the readers' gradients of its K, V back (``backward(..., d_shared_kv=)``); "reuse" reads them as
    its key and value, (B, Hkv, Lk, d) each, after their layer's norms and RoPE, and has no key or value
    projection, norm or RoPE of its own (``mha_numpy.kv_sharing`` walks a stack of such layers)."""

    reads, writes = ("K", "V", "key", "value"), ("K", "V")

    option = "kv_sharing"
    names = ("share_kv",)
    place = 47
    # no example: "store" changes no number of a call (only what its backward takes), and "reuse" takes another
    # layer's K and V as its key and value (kv_sharing.py and tests/test_llama4_gemma3.py run both)
    options = {"kv_sharing": Option(None, _kv_sharing)}
    groupwise = False
    not_groupwise = "the shared K and V (and their gradients from the layers that read them) are every head's"
    latent = False
    not_latent = "latent attention shares its latent, not K and V"

    def __init__(self, config):
        super().__init__(config)
        if config.kv_sharing == "reuse":  # a reader's K, V are its source's, cache included: pass them whole
            self.decodes, self.not_decodes = False, "a reusing layer reads its source's K and V, cache included"
            self.reads = ("key", "value")

    def check(self, f):
        if self.c.kv_sharing != "reuse":
            return
        expected = (f.B, self.c.num_kv_heads, f.key.shape[2], self.c.head_dim)
        for name, x in (("key", f.key), ("value", f.value)):
            if x.shape != expected:
                raise ValueError(f"{name} of a kv_sharing='reuse' layer must be its source's K or V, (B, Hkv, Lk, "
                                 f"d) = {expected}, got {x.shape}")  # fmt: skip

    def forward(self, f, s):
        if self.c.kv_sharing == "reuse":
            f.K, f.V = f.key, f.value  # F1: (B, Hkv, Lk, d) each, their layer's

    def backward(self, g, s):
        if self.c.kv_sharing == "reuse":
            g.key, g.value = g.K, g.V  # ← F1: to their layer, which adds them to its own
        elif g.shared_kv is not None:
            d_k, d_v = g.shared_kv  # the readers' gradients of this layer's K and V, summed over the readers
            g.K, g.V = g.K + d_k, g.V + d_v  # K and V have more than one reader: their gradients add


class ScoreTerm(Step):
    """Base of a change of the scores through the kernels' one hook (``kernels.ScoreMod``, FlexAttention's form): a
    pair ``functional.NAME_score(score, b, h, q_idx, kv_idx, **params)`` / ``NAME_score_vjp(..., d_out, **params)
    -> (d_score, {param: gradient})``, given the step's parameters by name (and the ``constants`` of the call).

    Every kernel applies it to the block of scores it holds, after the bias, before the mask, and its backward
    returns the parameters' gradients (``AttentionGrads.score_params``); so a new score term is a pair and a step,
    with no kernel, flow or cache edit. Under recompute a group's kernel sees its heads as 0 ... g - 1 and the
    parameters' slices of those heads (``Param.heads``), so ``h`` indexes them as it does the whole."""

    reads, writes = ("Q", "K", "args"), ("args",)

    score = staticmethod(None)  # the pair, set by each term
    score_vjp = staticmethod(None)

    def constants(self, f) -> dict:
        """What the pair reads besides the parameters, fixed for the call (e.g. the number of keys)."""
        return {}

    def forward(self, f, s):
        """Add the term to the call's score mods (F1); the kernel applies it to each block of scores."""
        params, constants = {name: f.P[name] for name in self.params()}, self.constants(f)
        mod = ScoreMod(self.option, partial(self.score, **constants), partial(self.score_vjp, **constants), params)
        f.args = f.args.add_score_mod(mod)  # F1: every kernel applies it to the blocks of scores it holds

    def backward(self, g, s):
        """The parameters' gradients, summed by the kernel over its blocks (``AttentionGrads.score_params``)."""
        grads = g.score_params.get(self.option, {})  # ← F1: the kernel's backward summed them over its blocks
        for name in self.params():
            g.P[name] = grads.get(name)


class HeadTemperature(ScoreTerm):
    """A learned temperature per head, scores · exp(t_h) (head_temperature (H,), 0 at the start: no change)."""

    option = "head_temperature"
    place = 50
    options = {"head_temperature": Option(False, _flag, example={"head_temperature": True})}
    score = staticmethod(F.head_temperature_score)
    score_vjp = staticmethod(F.head_temperature_score_vjp)

    def params(self):
        return {"head_temperature": Param((self.c.num_heads,), "q", init=_zeros((self.c.num_heads,)))}


class LogLengthScale(ScoreTerm):
    """Each query's scores · (log(⌊(p + 1) / floor⌋ + 1) · scale + 1) at its position p (Llama 4's temperature)."""

    option = "log_length_scale"
    place = 51  # after the head temperature, before the additive terms: it scales q·k only, as Llama 4's query does
    options = {
        "log_length_scale": Option(  # Llama 4's attn_scale (0.1)
            None, _positive_or_none, example={"log_length_scale": 0.5, "log_length_floor": 1}
        ),
        "log_length_floor": Option(8192.0, _positive, requires="log_length_scale"),  # Llama 4's floor_scale (8192)
    }
    score = staticmethod(F.log_length_scale_score)
    score_vjp = staticmethod(F.log_length_scale_score_vjp)

    def constants(self, f):
        c = self.c  # query i at position i + cached: after the KV cache's positions (0, 1, ... without one)
        return {"attn_scale": c.log_length_scale, "floor_scale": c.log_length_floor, "offset": f.cached}


class RelativeBias(ScoreTerm):
    """A learned bias per head and clipped distance j - i, added to the scores (T5-style; the table: rel_bias)."""

    option = "rel_pos_max_distance"
    place = 52
    options = {
        "rel_pos_max_distance": Option(None, _count_or_none, example={"rel_pos_max_distance": 2})
    }  # R: distances clipped to [-R, R]
    decodes = False
    not_decodes = "the table's bias is made per call, for the call's own keys"
    score = staticmethod(F.relative_position_score)
    score_vjp = staticmethod(F.relative_position_score_vjp)

    def params(self):
        shape = (self.c.num_heads, 2 * self.c.rel_pos_max_distance + 1)
        return {"rel_bias": Param(shape, "q", init=lambda rng, dtype: rng.normal(0.0, 1.0, size=shape).astype(dtype))}

    def constants(self, f):
        """The sequence's keys: the term skips the keys appended after them."""
        return {"keys": f.K.shape[2]}  # keys appended after these (add_bias_kv, add_zero_attn) get no term


class Alibi(ScoreTerm):
    """ALiBi: a fixed penalty -m_h · distance per head added to the scores (no parameter, no gradient)."""

    option = "alibi"
    place = 54
    options = {"alibi": Option(False, _flag, example={"alibi": True})}
    score = staticmethod(F.alibi_score)
    score_vjp = staticmethod(F.alibi_score_vjp)

    def constants(self, f):
        """This flow's heads' slopes, the queries' offset after the cached keys, the sequence's keys."""
        Lq, Lk = f.Q.shape[2], f.K.shape[2]  # query i at position i + Lk - Lq: after the cached keys
        return {"slopes": F.alibi_slopes(self.c.num_heads)[f.heads], "offset": Lk - Lq, "keys": Lk}  # this flow's heads


class SoftCap(ScoreTerm):
    """Soft-capped scores, cap · tanh(s / cap), inside the kernel after the score terms, before the mask (Gemma 2)."""

    option = "softcap"
    place = 56
    options = {"softcap": Option(None, _positive_or_none, example={"softcap": 1.5})}  # the cap (Gemma 2: 50)
    score = staticmethod(F.soft_cap_score)
    score_vjp = staticmethod(F.soft_cap_score_vjp)

    def constants(self, f):
        """The cap."""
        return {"cap": self.c.softcap}


class Sinks(Step):
    """A learned logit per head in every row's softmax denominator, weight that goes to no key (gpt-oss's sinks)."""

    reads, writes = ("args",), ("args",)

    option = "sinks"
    place = 58
    options = {"sinks": Option(False, _flag, example={"sinks": True})}

    def params(self):
        H = self.c.num_heads  # one per query head: recompute's groups take their heads' slice
        return {"sinks": Param((H,), "q", init=lambda rng, dtype: rng.normal(0.0, 0.02, size=H).astype(dtype))}

    def forward(self, f, s):
        f.args = f.args.with_sinks(f.P["sinks"])  # F1: every kernel starts each row's softmax from it

    def backward(self, g, s):
        g.P["sinks"] = g.sinks  # ← F1: the kernel's backward returns its gradient


class BiasKV(Step):
    """A learned key bias_k and value bias_v appended after the sequence's keys (torch MHA's add_bias_kv)."""

    reads, writes = ("K", "V", "args"), ("K", "V", "args")

    option = "add_bias_kv"
    names = ("bias_k", "bias_v")
    appended = 1
    place = 60
    options = {"add_bias_kv": Option(False, _flag, exports=("torch_mha",), example={"add_bias_kv": True})}
    latent = False
    not_latent = "its key and value are one per key/value head of the projections, which latent attention expands"

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

    reads, writes = ("K", "V", "args"), ("K", "V", "args")

    option = "add_zero_attn"
    names = ("zero_k", "zero_v")
    appended = 1
    place = 62
    options = {"add_zero_attn": Option(False, _flag, exports=("torch_mha",), example={"add_zero_attn": True})}
    latent = False
    not_latent = "its zero key is d wide, and latent attention's keys (dqk) and values (dv) differ"

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

    reads, writes = ("V",), ("V",)

    option = "diff_attention"
    names = ("diff_values",)
    place = 64
    options = {
        "diff_attention": Option(False, _diff_attention, example={"diff_attention": True, "num_kv_heads": 2}),
        "diff_layer_idx": Option(0, _count, requires="diff_attention"),  # λ_init's layer
        "diff_norm_eps": Option(1e-5, _positive, requires="diff_attention"),  # the pair's RMSNorm
    }
    groupwise = False
    not_groupwise = _DIFF_NOT_GROUPWISE
    latent = False
    not_latent = "its pairs of heads join key/value heads j and j + Hkv/2, which latent attention does not have"

    def forward(self, f, s):
        f.V, s["diff_values"] = F.diff_values_forward(f.V, check=False)  # F1: (B, Hkv, Lk, 2d)

    def backward(self, g, s):
        g.V = F.diff_values_backward(g.V, s["diff_values"])  # ← F1: (B, Hkv, Lk, d)


class DiffCombine(Step):
    """Heads p and p + H/2 as one: (1 − λ_init) · RMSNorm(C_p − λ C_{p+H/2}), λ = e^(λq1·λk1) − e^(λq2·λk2) + λ_init."""

    reads, writes = ("context",), ("context",)

    option = "diff_attention"
    names = ("diff_lambda", "diff_combine")
    place = 85
    latent = False
    not_latent = DiffValues.not_latent
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


class OutputGate(Step):
    """The heads' contexts gated, context · sigmoid(gate), gate: each head's second half of q (Qwen3-Next)."""

    reads, writes = ("context", "q"), ("context",)

    option = "output_gate"
    names = ("output_gate",)
    place = 87
    latent = False
    not_latent = GateQuery.not_latent

    def forward(self, f, s):
        f.context, s["output_gate"] = F.output_gate_forward(f.context, f.q, check=False)  # F1: (B, H, Lq, d)

    def backward(self, g, s):
        g.context, g.q = F.output_gate_backward(g.context, s["output_gate"])  # ← F1: (B, H, Lq, d), (B, Lq, 2·H·d)


class RepeatKV(Step):
    """Each key/value head shared by H / Hkv query heads (grouped-query attention; nothing to do when Hkv = H)."""

    reads, writes = ("K", "V"), ("K_heads", "V_heads")

    names = ("k_repeat", "v_repeat")
    place, family = 70, "mha"

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

    reads, writes = ("Q", "K_heads", "V_heads", "args"), ("context", "attention")

    place = 80
    options = {
        "dropout": Option(0.0, lambda v, n, o: check_probability(v, n), exports=("torch_mha",)),  # on the weights
        "scale": Option(None, _positive_or_none),  # of the scores (None: 1/√d)
        "recompute": Option(False, _flag, exports=("torch_mha",), example={"recompute": True}),  # the same numbers
        "memory_budget": Option(None, _count_or_none, exports=("torch_mha",)),  # bytes, then as recompute
    }

    def forward(self, f, s):
        """The kernel of the call on Q and the heads' K, V with the call's arguments (mask, score terms, ...)."""
        f.context, f.attention = f.kernel.run(f.Q, f.K_heads, f.V_heads, f.args)  # F1: (B, H, Lq, dv)

    def backward(self, g, s):
        """The kernel's backward: dQ, dK, dV per head, the bias's and the sinks' and the score terms' gradients."""
        grads = g.kernel.backward(g.context, g.attention)  # ← F1: AttentionGrads
        g.Q, g.K_heads, g.V_heads, g.bias, g.sinks = grads
        g.score_params = getattr(grads, "score_params", {})  # the score terms' parameters (``ScoreTerm``)


class Merge(Step):
    """merged (B, Lq, H·dv): the heads' contexts side by side (the inverse of the split; dv = d but in MLA)."""

    reads, writes = ("context",), ("merged",)

    names = ("merge",)
    place = 90

    def forward(self, f, s):
        f.merged, s["merge"] = F.merge_heads_forward(f.context, check=False)  # F1: (B, Lq, E)

    def backward(self, g, s):
        g.context = F.merge_heads_backward(g.merged, s["merge"])  # ← F1: (B, H, Lq, d)


class OutProject(Step):
    """output = merged W_oᵀ + b_o."""

    reads, writes = ("merged",), ("output",)

    names = ("out_proj",)
    place = 95

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
    """The steps of one call, in forward order: every registered step (``DATA_PATH``) the options put in it, by
    ``place`` (``Step.place_in``), then ``check_plan``'s refusals. The only place the options meet.

    kv_cache: the call appends to a KV cache (a call argument, not an option of the module): True or what the
    cache ``stores``, "keys after RoPE" (``KVCache``, ``LatentCache``) or "keys before RoPE" (``StreamingKVCache``:
    appended before RoPE, which then turns every key at its place in the cache).
    """
    placed = [(place, i, cls) for i, cls in enumerate(DATA_PATH) if (place := cls.place_in(c, kv_cache)) is not None]
    return check_plan(c, [cls(c) for _, _, cls in sorted(placed)], kv_cache)


class PlanError(RuntimeError):
    """A data path whose steps do not fit together (a step placed before the one that writes what it reads): a
    defect of the steps' declarations, not of the user's options."""


def check_plan(c, steps, kv_cache: bool) -> tuple[Step, ...]:
    """The refusals, by what each step declares it can do (a ValueError naming both options), then the contract of
    the order (each tensor a step ``reads`` written by a step before it; ``PlanError``) -> the steps as a tuple.
    ``build_steps``'s last line."""
    for step in steps:
        if c.latent and not step.latent:
            raise ValueError(f"{step.option} with kv_lora_rank (latent attention) is not supported: {step.not_latent}")
        if c.recompute and not step.groupwise:
            raise ValueError(f"{step.option} with recompute=True is not supported: {step.not_groupwise}")
        if kv_cache and not step.decodes:
            raise ValueError(f"kv_cache with {step.option} is not supported: {step.not_decodes}")
        if c.dropout and not step.with_dropout:
            raise ValueError(f"{step.option} with dropout={c.dropout:g} is not supported: {step.not_with_dropout}")
    written = {"query", "key", "value", "args"}  # what the boundary gives the first step (``MultiHeadAttention``)
    for step in steps:  # the contract of the order: each tensor a step reads was written before it
        missing = [name for name in step.reads if name not in written]
        if missing:
            raise PlanError(f"{type(step).__name__} reads {', '.join(missing)}, which no step before it writes")
        written.update(step.writes)
    if "output" not in written:
        raise PlanError("no step writes the output")
    return tuple(steps)


def describe(c: AttentionConfig, steps) -> str:
    """The plan as text: one numbered line per step, its cache names, and the parameters it owns."""
    lines = [f"the data path of {c.embed_dim}-wide attention with {c.num_heads} heads ({len(steps)} steps):"]
    width = max([13, *(len(type(step).__name__) for step in steps)])  # the names' column
    for i, step in enumerate(steps, 1):
        lines.append(f"{i:3d} {type(step).__name__:<{width}} {step.describe()}")
        own = ", ".join(f"{name} {p.shape}" for name, p in step.params().items())
        if own:
            lines.append(f"{'':{width + 5}}params: {own}")
    return "\n".join(lines)
