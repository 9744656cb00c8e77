"""What the tool calls: an ``Implementation`` runs one case (forward, and the backward when asked) and returns NumPy.

The calling convention a NumPy function follows (``from_numpy``; torch and JAX functions take the same arguments as
their own tensors, ``torch_adapters`` and ``jax_adapter``):

    out = fn(q, k, v, mask=None, scale=None, is_causal=False, dropout_p=0.0, dropout_mask=None)
    out = (out, weights) is taken too (weights (B, H, Lq, Lk) before dropout, or None)
    dq, dk, dv = fn_vjp(q, k, v, d_out, **the same keywords)

    q (B, H, Lq, d); k, v (B, Hkv, Lk, d), Hkv dividing H (GQA: query head h reads kv head h // (H / Hkv));
    out (B, H, Lq, d). layout="blhd": every one of them (B, L, heads, d) instead.
    mask: 4-D, broadcastable to (B, H, Lq, Lk), in the function's ``mask_convention`` (``MASK_CONVENTIONS``).
    scale: None = 1/sqrt(d). is_causal: query i sees keys j <= i + Lk - Lq (bottom-right: the last query at the
    last key, a KV cache; with Lq > Lk the first Lq - Lk rows see nothing and are zero). dropout_mask: bool
    (B, H, Lq, Lk), True = keep, given with dropout_p: survivors are scaled by 1 / (1 - dropout_p).

A keyword is passed only when the case uses it, so a function without ``scale=`` still runs every case that does
not set one; a case needing a keyword the signature lacks is "n/a". A function that raises NotImplementedError
on a case, or that declares ``without=("gqa", ...)``, is not run on it (n/a, never a failure).
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass, field

import numpy as np

from .. import functional as F
from .. import masks
from ..kernels import get_kernel
from .cases import FEATURES
from .dtypes import DTYPES, FINFO_MIN, HELD, as_numpy_dtype

MASK_CONVENTIONS = {
    "attend": "ours and SDPA's: bool True = may attend, or a float added",
    "ignore": "torch MHA's: bool True = ignore (masked out), or a float added",
    "additive": "floats only: 0 = attend, -inf = blocked, or a float added",
    "finite-min": "Hugging Face eager's: floats, 0 = attend, finfo(dtype).min = blocked, or a float added",
    "hf-01": "Hugging Face's attention_mask (B, Lk): 1 = keep, 0 = padding (key padding masks only)",
}
LAYOUTS = ("bhld", "blhd")


class NotSupported(Exception):
    """The implementation cannot take this case (a feature, dtype or mask it lacks): the case is n/a."""


@dataclass
class Call:
    """What one case hands to an implementation, NumPy in the case's dtype (bfloat16 held as float32)."""

    dtype: str
    q: np.ndarray  # (B, H, Lq, d)
    k: np.ndarray  # (B, Hkv, Lk, d)
    v: np.ndarray  # (B, Hkv, Lk, d)
    mask: np.ndarray | None  # our convention, 4-D
    scale: float | None
    is_causal: bool
    dropout_p: float
    dropout_mask: np.ndarray | None  # (B, H, Lq, Lk) True = keep
    d_out: np.ndarray | None  # (B, H, Lq, d) when the backward is asked


@dataclass
class Outcome:
    """What an implementation returned, as NumPy in our layout: out (B, H, Lq, d), weights or None, grads or None."""

    out: np.ndarray
    weights: np.ndarray | None = None
    grads: tuple | None = None  # (dq, dk, dv)
    written: tuple = ()  # the names of the arguments the function wrote into (``written``), seen by the adapter


@dataclass
class Implementation:
    """A function under test, adapted: ``run(call) -> Outcome``; ``features``: what it takes of ``FEATURES``."""

    name: str
    run: object  # Callable[[Call], Outcome]
    features: frozenset = frozenset(FEATURES)
    dtypes: tuple = DTYPES
    mask_convention: str = "attend"
    notes: list = field(default_factory=list)  # shown under the report's title (e.g. what is not taken, and why)

    def __call__(self, call: Call) -> Outcome:
        return self.run(call)


def written(handed: dict, before: dict) -> tuple[str, ...]:
    """The names whose array in ``handed`` no longer equals the one in ``before`` (NaN equal to NaN): the
    arguments a function wrote into. Inputs are never to be mutated (a caller reuses them: its reference, the
    next layer, the backward)."""
    return tuple(
        n
        for n, a in handed.items()
        if a is not None and not (a.shape == before[n].shape and np.array_equal(a, before[n], equal_nan=True))
    )


def check_choice(value, name: str, choices) -> str:
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}, got {value!r:.60}")
    return value


def features_of(params: set[str] | None, names: dict, without=(), backward: bool = True) -> frozenset:
    """The features a signature's parameter names give (None: it takes **kwargs, so all), minus ``without``."""
    without = set(without)
    unknown = without - set(FEATURES)
    if unknown:
        raise ValueError(f"without must name features among {', '.join(FEATURES)}, got {sorted(unknown)}")
    have = (
        set(FEATURES)
        if params is None
        else {"gqa", "backward", *(f for f, keys in names.items() if params & set(keys))}
    )
    if not backward:
        have.discard("backward")
    return frozenset(have - without)


def parameters(fn) -> set[str] | None:
    """The parameter names of ``fn`` (None if it takes **kwargs), from its signature or its docstring's first line
    (builtins such as torch's scaled_dot_product_attention have no signature)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        m = re.match(r"\s*\w+\((.*?)\)", getattr(fn, "__doc__", None) or "", re.S)
        if not m:
            return None
        return {p.split("=")[0].strip().lstrip("*") for p in m[1].split(",") if p.strip()}
    if any(p.kind == p.VAR_KEYWORD for p in sig.parameters.values()):
        return None
    return set(sig.parameters)


# --------------------------------------------------------------------------- masks and layouts at the edge


def convert_mask(mask, convention: str, dtype: str):
    """Our mask (4-D) -> the function's convention (NumPy); NotSupported when that convention cannot hold it."""
    if mask is None:
        return None
    if mask.dtype != np.bool_:  # a float mask is added in every convention
        if convention == "hf-01":
            raise NotSupported("the hf-01 convention holds key padding only, not a float mask")
        return mask
    if convention == "attend":
        return mask
    if convention == "ignore":
        return ~mask
    if convention == "hf-01":
        if mask.shape[1:3] != (1, 1):
            raise NotSupported("the hf-01 convention holds key padding (B, Lk) only; this mask is per query")
        return mask[:, 0, 0, :].astype(np.int64)  # (B, Lk), 1 = keep
    low = -np.inf if convention == "additive" else FINFO_MIN[dtype]
    return np.where(mask, 0.0, low).astype(HELD[dtype])  # (b, h, lq, lk) in the dtype


def to_layout(x, layout: str):
    """(B, heads, L, d) -> the function's layout (a view)."""
    return x if x is None or layout == "bhld" else x.swapaxes(1, 2)


def from_layout(x, layout: str):
    """The function's layout -> (B, heads, L, d)."""
    return x if x is None or layout == "bhld" else np.swapaxes(x, 1, 2)


def keywords(call: Call, names: dict, mask) -> dict:
    """The keywords a case passes, under the function's own names (``names``: argument -> the function's name for
    it; an argument missing from ``names`` is not passed)."""
    given = {"mask": mask, "scale": call.scale, "is_causal": call.is_causal or None,
             "dropout_p": call.dropout_p or None, "dropout_mask": call.dropout_mask}  # fmt: skip
    return {names[a]: value for a, value in given.items() if value is not None and a in names}


def split_output(result):
    """A function's result -> (out, weights or None): it returns out, or (out, weights)."""
    if isinstance(result, (tuple, list)):
        if len(result) != 2:
            raise TypeError(
                f"returned a {type(result).__name__} of {len(result)} items; expected out or (out, weights)"
            )
        return result[0], result[1]
    return result, None


# --------------------------------------------------------------------------- NumPy functions

NUMPY_NAMES = {"mask": ("mask",), "scale": ("scale",), "is_causal": ("is_causal",),
               "dropout": ("dropout_mask",)}  # fmt: skip
KEYWORDS = {"mask": "mask", "scale": "scale", "is_causal": "is_causal", "dropout_p": "dropout_p",
            "dropout_mask": "dropout_mask"}  # fmt: skip


def from_numpy(fn, vjp=None, *, layout="bhld", mask_convention="attend", dtypes=("float64", "float32"), without=(),
               name=None) -> Implementation:  # fmt: skip
    """A NumPy function of the calling convention (module docstring) and, for the backward, its VJP."""
    if not callable(fn) or (vjp is not None and not callable(vjp)):
        raise ValueError(f"fn and vjp must be callables, got {fn!r:.60} and {vjp!r:.60}")
    layout, mask_convention = (
        check_choice(layout, "layout", LAYOUTS),
        check_choice(mask_convention, "mask_convention", MASK_CONVENTIONS),
    )
    dtypes = tuple(check_choice(t, "dtypes", DTYPES) for t in dtypes)
    params = parameters(fn)
    features = features_of(params, NUMPY_NAMES, without, backward=vjp is not None)
    names = {a: n for a, n in KEYWORDS.items() if params is None or n in params}

    def run(call: Call) -> Outcome:
        q, k, v = (to_layout(as_numpy_dtype(a, call.dtype), layout) for a in (call.q, call.k, call.v))
        kw = keywords(call, names, convert_mask(call.mask, mask_convention, call.dtype))
        d_out = None if call.d_out is None else to_layout(as_numpy_dtype(call.d_out, call.dtype), layout)
        handed = {"q": q, "k": k, "v": v, "d_out": d_out, **{n: a for n, a in kw.items() if isinstance(a, np.ndarray)}}
        before = {n: None if a is None else a.copy() for n, a in handed.items()}  # what it is handed may be a
        out, weights = split_output(fn(q, k, v, **kw))  # copy (bfloat16, a mask converted): checked here
        grads = None
        if d_out is not None:
            grads = tuple(from_layout(g, layout) for g in vjp(q, k, v, d_out, **kw))
        return Outcome(from_layout(out, layout), weights, grads, written(handed, before))

    label = name or getattr(fn, "__qualname__", repr(fn))
    return Implementation(label, run, features, dtypes, mask_convention)


# --------------------------------------------------------------------------- mha_numpy's own kernels


def kernel(impl: str = "vectorized", **options) -> Implementation:
    """One of our kernels (``mha_numpy.kernels``) as an implementation under test: GQA through
    ``functional.repeat_kv``, is_causal as ``masks.causal_mask`` bottom-right, as ``MultiHeadAttention`` does."""
    k_obj = get_kernel(impl, **options)

    def run(call: Call) -> Outcome:
        B, H, Lq, _ = call.q.shape
        n_rep, Lk = H // call.k.shape[1], call.k.shape[2]
        K, c_k = F.repeat_kv_forward(call.k, n_rep)  # (B, H, Lk, d)
        V, c_v = F.repeat_kv_forward(call.v, n_rep)
        mask = call.mask
        if call.is_causal:
            mask = masks.combine_masks(mask, masks.causal_mask(Lq, Lk, diagonal=Lk - Lq))
        out, cache = k_obj.forward(call.q, K, V, mask, call.scale, call.dropout_p, dropout_mask=call.dropout_mask)
        grads = None
        if call.d_out is not None:
            dq, dK, dV = k_obj.backward(call.d_out, cache)[:3]  # (dq, dk, dv, d_bias, ...): the first three
            grads = (dq, F.repeat_kv_backward(dK, c_k), F.repeat_kv_backward(dV, c_v))
        return Outcome(out, cache.attn_weights, grads)

    return Implementation(f"mha_numpy kernel {impl!r}", run, frozenset(FEATURES), ("float64", "float32"))
