"""RoPE's frequency tables: the inverse frequencies and the attention factor of every ``rope_type`` of Hugging Face's
``ROPE_INIT_FUNCTIONS`` (``transformers.modeling_rope_utils``), in float64, from the same fields.

    rope_frequencies(scaling, theta, head_dim, partial_rotary_factor, seq_len) -> (inv_freq (n,), attention_factor)

The ``Rope`` step turns pair i of each head by position · inv_freq[i] and scales the turned features by
``attention_factor`` (transformers' cos and sin times it: YaRN's mscale), n = int(head_dim · partial_rotary_factor) / 2
pairs; ``proportional`` (Gemma's) covers the whole head, its last frequencies 0 (pairs that do not turn).

With ω_i = θ^(-2i/r), i = 0 ... n-1, r = 2n, each rope_type's table and fields (required; optional):

- default: ω_i.
- linear: ω_i / factor.  (factor)
- dynamic: ω_i with the base θ' = θ · (factor · L / M - (factor - 1))^(r / (r - 2)), L = max(seq_len, M): NTK-aware,
  by the length seen.  (factor, max_position_embeddings)
- yarn: ω_i / factor · (1 - γ_i) + ω_i · γ_i, γ_i = 1 - ramp(i), the ramp between the pairs that turn beta_fast and
  beta_slow times over the original length; attention factor 0.1 · ln(factor) + 1 (or mscale's ratio).
  (original_max_position_embeddings, factor; attention_factor, beta_fast 32, beta_slow 1, mscale, mscale_all_dim,
  truncate True, max_position_embeddings)
- longrope: ω_i / long_factor[i] when seq_len > original, else ω_i / short_factor[i]; attention factor
  √(1 + ln(factor) / ln(original)).  (short_factor, long_factor, original_max_position_embeddings; factor,
  attention_factor, max_position_embeddings)
- llama3: with the wavelength λ_i = 2π / ω_i and the original length N: ω_i where λ_i < N / high_freq_factor,
  ω_i / factor where λ_i > N / low_freq_factor, a smooth mix between (Llama 3.1).  (factor,
  original_max_position_embeddings, low_freq_factor, high_freq_factor)
- proportional: θ^(-2i/d) for i < int(p · d // 2), 0 for the rest of the d/2 pairs, all / factor.  (; factor)

M is ``max_position_embeddings``, which transformers reads from the model's config beside its ``rope_parameters``;
here it is a field of the dict (needed by ``dynamic``, and by ``yarn`` and ``longrope`` when ``factor`` is not
given: then factor = M / original). The dict is transformers' ``rope_parameters``; ``rope_theta`` and
``partial_rotary_factor`` may be in it when they equal the module's options. ``check_rope_scaling`` turns it into
a ``RopeScaling`` (frozen, hashable) or raises ValueError naming ``rope_scaling`` and the field.

Length: ``dynamic`` and ``longrope`` depend on the length seen, seq_len = the largest position of the call + 1
(transformers': ``max(position_ids) + 1``). Ours is a function of the call, no state: during decoding the positions
grow, and every call uses the table of its own length, as transformers' ``dynamic_rope_update`` does for a sequence
that grows (it recomputes when the length passes the longest seen, and goes back to the original table below M).
It keeps the longest length seen in the module, so a later, shorter call of length between M and that longest
reuses the longest's table; ours uses its own length's. Keys already in a KV cache keep the rotation they were
cached with, in both. Derivation: docs/derivation.md, "RoPE scaling".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import numpy as np

from ._checks import as_bool, as_int, as_number

ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "longrope", "llama3", "proportional")
"""Every rope_type of transformers' ``ROPE_INIT_FUNCTIONS`` (and "default")."""


@dataclass(frozen=True)
class RopeScaling:
    """A checked ``rope_scaling`` dict (``check_rope_scaling``): its rope_type and the fields it gives (None: not
    given). Frozen and hashable (the factor lists as tuples), so a config holding it stays a dict key."""

    rope_type: str
    factor: float | None = None
    max_position_embeddings: int | None = None
    original_max_position_embeddings: int | None = None
    attention_factor: float | None = None
    beta_fast: float | None = None
    beta_slow: float | None = None
    mscale: float | None = None
    mscale_all_dim: float | None = None
    truncate: bool | None = None
    short_factor: tuple | None = None
    long_factor: tuple | None = None
    low_freq_factor: float | None = None
    high_freq_factor: float | None = None

    def as_dict(self) -> dict:
        """The fields given, as transformers' ``rope_parameters`` holds them (lists for the factor lists)."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}
        return {k: list(v) if isinstance(v, tuple) else v for k, v in out.items()}

    def __repr__(self) -> str:
        return f"RopeScaling({self.as_dict()!r})"


# rope_type -> (required fields, optional fields), as transformers' _validate_*_rope_parameters (and M where it
# reads the config's max_position_embeddings)
_FIELDS = {
    "default": ((), ()),
    "linear": (("factor",), ()),
    "dynamic": (("factor", "max_position_embeddings"), ()),
    "yarn": (
        ("original_max_position_embeddings",),
        (
            "factor",
            "max_position_embeddings",
            "attention_factor",
            "beta_fast",
            "beta_slow",
            "mscale",
            "mscale_all_dim",
            "truncate",
        ),
    ),
    "longrope": (
        ("short_factor", "long_factor", "original_max_position_embeddings"),
        ("factor", "attention_factor", "max_position_embeddings"),
    ),
    "llama3": (("factor", "original_max_position_embeddings", "low_freq_factor", "high_freq_factor"), ()),
    "proportional": ((), ("factor",)),
}
_SIZES = ("max_position_embeddings", "original_max_position_embeddings")
_LISTS = ("short_factor", "long_factor")
_ANY_NUMBER = ("mscale", "mscale_all_dim")  # transformers reads them by truth: 0 is "not given"


def _field(key: str, value, name: str, pairs: int):
    """One field checked: ValueError naming rope_scaling[key] and the value."""
    label = f"{name}[{key!r}]"
    if key in _SIZES:
        return as_int(value, label, minimum=1)
    if key == "truncate":
        return as_bool(value, label)
    if key in _LISTS:
        if isinstance(value, (str, bytes, dict)) or not hasattr(value, "__len__"):
            raise ValueError(f"{label} must be a list of {pairs} positive numbers (one per turned pair), got {value!r}")
        if len(value) != pairs:
            raise ValueError(f"{label} must have {pairs} entries (one per turned pair), got {len(value)}")
        return tuple(as_number(v, f"{label}[{i}]", positive=True) for i, v in enumerate(value))
    return as_number(value, label, positive=key not in _ANY_NUMBER)


def check_rope_scaling(value, name: str = "rope_scaling", theta=None, head_dim=None, partial_rotary_factor=1.0):
    """A ``rope_scaling`` dict (transformers' ``rope_parameters`` form) -> ``RopeScaling``, or None for None and
    rope_type "default"; ValueError naming ``name`` and the field at fault: not a dict, an unknown rope_type, a
    missing, unknown or wrong-typed field, a factor list of the wrong length, ``rope_theta`` or
    ``partial_rotary_factor`` other than the module's, a dynamic table of 2 features (its exponent r / (r - 2))."""
    if value is None:
        return None
    if isinstance(value, RopeScaling):  # checked again against this module's sizes
        value = {"rope_type": value.rope_type, **value.as_dict()}
    if not isinstance(value, dict):
        raise ValueError(f"{name} must be a dict such as {{'rope_type': 'yarn', 'factor': 4.0}}, got {value!r:.80}")
    kind = value.get("rope_type")
    if kind not in ROPE_TYPES:
        raise ValueError(f"{name}['rope_type'] must be one of {', '.join(ROPE_TYPES)}, got {kind!r}")
    required, optional = _FIELDS[kind]
    given = {k: v for k, v in value.items() if k != "rope_type"}
    for key, ours in (("rope_theta", theta), ("partial_rotary_factor", partial_rotary_factor)):
        if key in given and ours is not None and given.pop(key) != ours:
            raise ValueError(f"{name}[{key!r}]={value[key]!r} differs from the module's {key}={ours!r}; give it once")
    unknown = sorted(set(given) - set(required) - set(optional))
    if unknown:
        raise ValueError(f"{name}[{unknown[0]!r}] is not a field of rope_type {kind!r} (it reads "
                         f"{', '.join(required + optional) or 'none'})")  # fmt: skip
    missing = [k for k in required if given.get(k) is None]
    if missing:
        raise ValueError(f"{name} with rope_type {kind!r} needs {name}[{missing[0]!r}]")
    if kind in ("yarn", "longrope") and given.get("factor") is None and given.get("max_position_embeddings") is None:
        raise ValueError(f"{name} with rope_type {kind!r} needs {name}['factor'] (or max_position_embeddings, "
                         "then factor = max_position_embeddings / original_max_position_embeddings)")  # fmt: skip
    pairs = int(head_dim * partial_rotary_factor) // 2 if head_dim is not None else None
    checked = {k: _field(k, v, name, pairs) for k, v in given.items() if v is not None}
    if kind == "llama3" and not checked["high_freq_factor"] > checked["low_freq_factor"]:
        raise ValueError(f"{name}['high_freq_factor'] must be above low_freq_factor, got {checked['high_freq_factor']} "
                         f"and {checked['low_freq_factor']}")  # fmt: skip
    if kind == "dynamic" and pairs == 1:
        raise ValueError(f"{name} with rope_type 'dynamic' turns 2 features: its base's exponent r / (r - 2) is "
                         "undefined at r = 2 (transformers divides by zero)")  # fmt: skip
    return None if kind == "default" else RopeScaling(kind, **checked)


# --------------------------------------------------------------------------- the tables, one per rope_type


def default_frequencies(theta: float, dim: int) -> np.ndarray:
    """ω_i = θ^(-2i/r), i = 0 ... r/2 - 1 (RoPE's own table; r = the turned features): (r/2,) float64."""
    return 1.0 / theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim)


def _rotary_dim(head_dim: int, partial_rotary_factor: float) -> int:
    return int(head_dim * partial_rotary_factor)  # transformers' rule


def linear_frequencies(s: RopeScaling, theta, head_dim, partial_rotary_factor=1.0, seq_len=None):
    """Position interpolation (kaiokendev): ω_i / factor, attention factor 1 (``_compute_linear_scaling_...``)."""
    return default_frequencies(theta, _rotary_dim(head_dim, partial_rotary_factor)) / s.factor, 1.0


def dynamic_ntk_frequencies(s: RopeScaling, theta, head_dim, partial_rotary_factor=1.0, seq_len=None):
    """Dynamic NTK (bloc97, emozilla): the base raised with the length seen, L = max(seq_len, M):
    θ' = θ · (factor · L / M - (factor - 1))^(r / (r - 2)), ω_i = θ'^(-2i/r); at L ≤ M the default table
    (``_compute_dynamic_ntk_parameters``). Attention factor 1."""
    r, M = _rotary_dim(head_dim, partial_rotary_factor), s.max_position_embeddings
    L = M if seq_len is None else max(int(seq_len), M)
    base = theta * ((s.factor * L / M) - (s.factor - 1)) ** (r / (r - 2))
    return default_frequencies(base, r), 1.0


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def yarn_factor(s: RopeScaling) -> float:
    """YaRN's and LongRoPE's scale: ``factor``, or M / original when it is not given (DeepSeek-V3, Phi-3)."""
    return s.factor if s.factor is not None else s.max_position_embeddings / s.original_max_position_embeddings


def yarn_attention_factor(s: RopeScaling) -> float:
    """YaRN's attention factor (mscale): the given one, or mscale(factor, mscale) / mscale(factor, mscale_all_dim)
    when both are given (DeepSeek), or 0.1 · ln(factor) + 1 (1 at factor ≤ 1)."""
    if s.attention_factor is not None:
        return s.attention_factor
    factor = yarn_factor(s)
    if s.mscale and s.mscale_all_dim:
        return _yarn_mscale(factor, s.mscale) / _yarn_mscale(factor, s.mscale_all_dim)
    return _yarn_mscale(factor)


def yarn_frequencies(s: RopeScaling, theta, head_dim, partial_rotary_factor=1.0, seq_len=None):
    """YaRN (Peng et al. 2023, ``_compute_yarn_parameters``): pair i keeps ω_i (extrapolation) where it turns
    more than beta_fast times over the original length, takes ω_i / factor (interpolation) where it turns fewer
    than beta_slow times, and a linear ramp between; attention factor ``yarn_attention_factor``."""
    r, factor = _rotary_dim(head_dim, partial_rotary_factor), yarn_factor(s)
    original = s.original_max_position_embeddings
    beta_fast, beta_slow = s.beta_fast or 32.0, s.beta_slow or 1.0

    def dim_of(rotations):  # the pair index that turns ``rotations`` times over the original length
        return r * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = dim_of(beta_fast), dim_of(beta_slow)
    if s.truncate is None or s.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, r - 1)
    if low == high:
        high += 0.001  # transformers' guard against a zero-width ramp
    ramp = np.clip((np.arange(r // 2, dtype=np.float64) - low) / (high - low), 0.0, 1.0)  # (r/2,) 0 ... 1
    keep = 1.0 - ramp  # the extrapolated share of each pair
    omega = default_frequencies(theta, r)
    return omega / factor * (1.0 - keep) + omega * keep, yarn_attention_factor(s)


def longrope_frequencies(s: RopeScaling, theta, head_dim, partial_rotary_factor=1.0, seq_len=None):
    """LongRoPE (Phi-3, ``_compute_longrope_parameters``): ω_i / long_factor[i] when the length seen is above
    original_max_position_embeddings, else ω_i / short_factor[i]; attention factor the given one, or
    √(1 + ln(factor) / ln(original)) (1 at factor ≤ 1)."""
    r, factor = _rotary_dim(head_dim, partial_rotary_factor), yarn_factor(s)
    original = s.original_max_position_embeddings
    attention = s.attention_factor
    if attention is None:
        attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    ext = np.asarray(s.long_factor if seq_len is not None and seq_len > original else s.short_factor, np.float64)
    return default_frequencies(theta, r) / ext, attention


def llama3_frequencies(s: RopeScaling, theta, head_dim, partial_rotary_factor=1.0, seq_len=None):
    """Llama 3.1's (``_compute_llama3_parameters``): with the wavelength λ_i = 2π / ω_i and the original length N,
    ω_i where λ_i < N / high_freq_factor, ω_i / factor where λ_i > N / low_freq_factor, and between them
    (1 - t) ω_i / factor + t ω_i with t = (N / λ_i - low_freq_factor) / (high_freq_factor - low_freq_factor)."""
    omega = default_frequencies(theta, _rotary_dim(head_dim, partial_rotary_factor))
    N, lo, hi = s.original_max_position_embeddings, s.low_freq_factor, s.high_freq_factor
    wavelength = 2 * math.pi / omega
    scaled = np.where(wavelength > N / lo, omega / s.factor, omega)
    t = (N / wavelength - lo) / (hi - lo)
    medium = ~(wavelength < N / hi) & ~(wavelength > N / lo)
    return np.where(medium, (1 - t) * scaled / s.factor + t * scaled, scaled), 1.0


def proportional_frequencies(s: RopeScaling, theta, head_dim, partial_rotary_factor=1.0, seq_len=None):
    """Proportional RoPE (Gemma 4, ``_compute_proportional_rope_parameters``): a table over the whole head,
    θ^(-2i/d) for the first int(p · d // 2) pairs and 0 for the rest (pairs that do not turn), all / factor."""
    angles = int(partial_rotary_factor * head_dim // 2)
    inv_freq = np.zeros(head_dim // 2)
    inv_freq[:angles] = 1.0 / theta ** (np.arange(0, 2 * angles, 2, dtype=np.float64) / head_dim)
    return inv_freq / (s.factor if s.factor is not None else 1.0), 1.0


FREQUENCIES = {
    "linear": linear_frequencies,
    "dynamic": dynamic_ntk_frequencies,
    "yarn": yarn_frequencies,
    "longrope": longrope_frequencies,
    "llama3": llama3_frequencies,
    "proportional": proportional_frequencies,
}
"""rope_type -> its table: ``fn(scaling, theta, head_dim, partial_rotary_factor, seq_len) -> (inv_freq, factor)``,
one per entry of transformers' ``ROPE_INIT_FUNCTIONS``."""


def rope_frequencies(scaling, theta: float, head_dim: int, partial_rotary_factor: float = 1.0, seq_len=None):
    """The table a call turns by -> (inv_freq (n,) float64, attention_factor): the default RoPE's for
    ``scaling`` None, else its rope_type's (``FREQUENCIES``). seq_len: the length seen (largest position + 1),
    read by ``dynamic`` and ``longrope`` only."""
    if scaling is None:
        return default_frequencies(theta, _rotary_dim(head_dim, partial_rotary_factor)), 1.0
    return FREQUENCIES[scaling.rope_type](scaling, theta, head_dim, partial_rotary_factor, seq_len)


def reads_length(scaling) -> bool:
    """Whether the table depends on the length seen: ``dynamic``, ``longrope``."""
    return scaling is not None and scaling.rope_type in ("dynamic", "longrope")
