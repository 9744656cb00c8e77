"""The reference, and the reference under each known alternative convention: what a failing function most likely
does differently.

``reference(x, case)`` is our vectorized kernel (``mha_numpy.kernels``) in float64 on a case's inputs: the ground
truth. ``reference(x, case, conv)`` computes the same case under another ``Convention`` (one field changed): the
bool mask read with the other polarity, is_causal aligned top-left, a fully masked row as NaN or as uniform
weights, the scale forgotten or applied twice, GQA heads interleaved, dropout without its rescale, the weights
returned after dropout, the backward's scale or dropout wrong, a softmax without the row max. ``ALTERNATIVES``
lists them with what each means; ``verify.detect`` re-runs a failing case under those that apply and names the
one the function's numbers match.

The changes are made around the kernel (its inputs, its cache, its outputs), so the kernel stays the one
implementation of attention; the backward variants re-compose ``functional``'s pairs from the kernel's cache.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from .. import functional as F
from .. import masks
from ..kernels import VectorizedKernel
from .cases import Case, CaseInputs
from .dtypes import HELD

KERNEL = VectorizedKernel()


@dataclass(frozen=True)
class Convention:
    """How an attention call is computed. The defaults are mha_numpy's (and the calling convention's)."""

    mask: str = "ours"  # "inverted": a bool mask read with the other polarity; "added": a bool mask added as 0/1
    causal: str = "bottom-right"  # is_causal's alignment; "top-left": query i sees keys j <= i
    masked_rows: str = "zero"  # a fully masked row: "zero" weights and output; "nan"; "uniform" weights 1/Lk;
    # "nan-grad": zero in the forward, NaN in the backward (a nan_to_num or where after the softmax)
    scale: str = "given"  # "forgotten" (1), "twice" (scale²), "default" (1/sqrt(d) whatever is given)
    gqa: str = "grouped"  # query head h reads kv head h // (H / Hkv); "interleaved": h % Hkv
    dropout: str = "ours"  # survivors x 1/(1 - p); "no-rescale"; "keep-inverted" (the keep-mask read as drop)
    weights: str = "before-dropout"  # the returned weights; "after-dropout"
    backward_scale: str = "given"  # dq, dk carry the scale; "missing"; "twice"
    backward_dropout: str = "ours"  # "softmax-dropped": the softmax backward takes the dropped weights;
    # "dv-undropped": dv = Pᵀ dO with the weights before dropout
    softmax: str = "stable"  # "no-max": exp(s) / sum(exp(s)) in the function's dtype, no row max subtracted


OURS = Convention()


@dataclass
class Tensors:
    """A computation's tensors by name (out, weights, dq, dk, dv) and, per name, the entries a match ignores."""

    values: dict
    dont_care: dict = field(default_factory=dict)
    max_logit: float = 0.0  # the largest |score| the softmax sees (finite, not a blocking finfo.min)


def largest_logit(masked_scores: np.ndarray) -> float:
    """max |s| over the scores that reach the softmax: finite and above -1e30 (finfo.min blocks, like -inf)."""
    s = masked_scores[np.isfinite(masked_scores) & (masked_scores > -1e30)]
    return float(np.abs(s).max()) if s.size else 0.0


# --------------------------------------------------------------------------- the pieces a convention changes


def effective_mask(mask, case: Case, conv: Convention = OURS) -> np.ndarray | None:
    """The case's mask (our convention) with is_causal made explicit, as ``conv`` reads them; 4-D or None."""
    m = mask
    if m is not None and m.dtype == np.bool_ and conv.mask != "ours":
        m = ~m if conv.mask == "inverted" else m.astype(np.float64)  # "added": True -> +1, False -> +0
    if case.is_causal:
        diagonal = case.Lk - case.Lq if conv.causal == "bottom-right" else 0
        m = masks.combine_masks(m, masks.causal_mask(case.Lq, case.Lk, diagonal=diagonal)[None, None])
    if m is not None and conv.masked_rows == "uniform":  # blocked entries get a finite minimum, which swallows
        low = np.finfo(np.float64).min  # the scores: a fully masked row is uniform, as HF's finfo.min in float32
        m = np.where(m, 0.0, low) if m.dtype == np.bool_ else np.maximum(m, low)
    return m


def blocked_rows(mask, shape) -> np.ndarray:
    """(B, H, Lq) True where a row has no key left (a bool mask all False, or a float mask all -inf)."""
    if mask is None:
        return np.zeros(shape[:3], dtype=bool)
    allowed = mask if mask.dtype == np.bool_ else ~np.isneginf(mask)
    return ~np.broadcast_to(allowed, shape).any(axis=-1)


def effective_scale(case: Case, conv: Convention = OURS) -> float:
    """The scale a function following ``conv`` applies to the case's scores (given, none, squared or 1/sqrt(d))."""
    s = case.real_scale
    return {"given": s, "forgotten": 1.0, "twice": s * s, "default": case.d**-0.5}[conv.scale]


def expand_kv(x: np.ndarray, H: int, gqa: str = "grouped") -> np.ndarray:
    """(B, Hkv, L, d) -> (B, H, L, d): query head h reads kv head h // (H / Hkv) (grouped) or h % Hkv."""
    n_rep = H // x.shape[1]
    if gqa == "grouped":
        return np.repeat(x, n_rep, axis=1)  # (B, H, L, d), head h <- h // n_rep (functional.repeat_kv_forward)
    return np.tile(x, (1, n_rep, 1, 1))  # (B, H, L, d), head h <- h % Hkv


def collapse_kv(dx: np.ndarray, Hkv: int, gqa: str = "grouped") -> np.ndarray:
    """The backward of ``expand_kv``: (B, H, L, d) -> (B, Hkv, L, d), each kv head's query heads summed."""
    B, H, L, d = dx.shape
    if gqa == "grouped":
        return dx.reshape(B, Hkv, H // Hkv, L, d).sum(axis=2)  # (B, Hkv, n_rep, L, d) -> (B, Hkv, L, d)
    return dx.reshape(B, H // Hkv, Hkv, L, d).sum(axis=1)  # (B, n_rep, Hkv, L, d) -> (B, Hkv, L, d)


def overflow_rows(x: CaseInputs, case: Case, mask, scale: float) -> np.ndarray:
    """(B, H, Lq) rows whose softmax without the row max is not finite in the case's dtype (exp overflows to inf,
    or every exp underflows to 0, or the row is fully masked: 0/0)."""
    held = HELD[case.dtype]  # bfloat16 has float32's exponent range: computed in float32
    q, K = x.q.astype(held), expand_kv(x.k.astype(held), case.H)
    with np.errstate(all="ignore"):
        s = (q * held(scale)) @ K.swapaxes(-1, -2)  # (B, H, Lq, Lk) in the dtype
        if mask is not None:
            s = np.where(mask, s, -np.inf) if mask.dtype == np.bool_ else s + mask.astype(held)
        total = np.exp(s).sum(axis=-1)  # (B, H, Lq): inf, or 0
    return ~(np.isfinite(total) & (total > 0))


# --------------------------------------------------------------------------- the reference under a convention


def reference(x: CaseInputs, case: Case, conv: Convention = OURS, dtype: str = "float64", backward: bool = True):
    """The case computed by our vectorized kernel in ``dtype`` (float64 or float32) under ``conv`` -> Tensors
    (out (B, H, Lq, d), weights (B, H, Lq, Lk) before dropout unless ``conv.weights``, and with ``backward`` dq,
    dk (B, Hkv, Lk, d), dv); the entries a function may differ on without contradicting ``conv`` are dont_care."""
    f = np.float64 if dtype == "float64" else np.float32
    q, k, v = (a.astype(f) for a in (x.q, x.k, x.v))
    mask, scale = effective_mask(x.mask, case, conv), effective_scale(case, conv)
    if mask is not None and mask.dtype != np.bool_:
        mask = mask.astype(f)  # a float16 mask's numbers, for the kernel (float32 or float64)
    K, V = expand_kv(k, case.H, conv.gqa), expand_kv(v, case.H, conv.gqa)  # (B, H, Lk, d)
    keep = x.keep if conv.dropout != "keep-inverted" else ~x.keep
    out, cache = KERNEL.forward(q, K, V, mask, scale, case.dropout_p, dropout_mask=keep)  # (B, H, Lq, d)
    weights = cache.attn_weights  # (B, H, Lq, Lk), before dropout
    if conv.weights == "after-dropout" and keep is not None:
        weights = weights * keep / (1.0 - case.dropout_p)  # (B, H, Lq, Lk)
    values = {"out": out, "weights": weights}
    if backward:
        dq, dK, dV = _backward(x.d_out.astype(f), cache, conv)
        if conv.backward_scale != "given":
            factor = 1.0 / scale if conv.backward_scale == "missing" else scale
            dq, dK = dq * factor, dK * factor
        values.update(dq=dq, dk=collapse_kv(dK, case.Hkv, conv.gqa), dv=collapse_kv(dV, case.Hkv, conv.gqa))
    if conv.dropout == "no-rescale" and keep is not None:  # every output is linear in the 1/(1 - p) factor
        values = {n: a if n == "weights" else a * (1.0 - case.dropout_p) for n, a in values.items()}
    tensors = Tensors(values, max_logit=largest_logit(cache.masked_scores))
    shape = (case.B, case.H, case.Lq, case.Lk)
    if conv.masked_rows != "zero":  # the rows the same mask blocks with -inf
        rows = blocked_rows(effective_mask(x.mask, case, replace(conv, masked_rows="zero")), shape)
        _masked_rows(tensors, rows, case, nan=conv.masked_rows == "nan", nan_grad=conv.masked_rows == "nan-grad")
    if conv.softmax == "no-max":
        _masked_rows(tensors, overflow_rows(x, case, mask, scale), case, nan=True)
    return tensors


def _backward(d_out, cache, conv: Convention):
    """dq, dK, dV (B, H, ·, d) of the kernel's cache; the dropout variants re-compose functional's pairs."""
    if conv.backward_dropout == "ours" or cache.dropout_mask is None:
        return KERNEL.backward(d_out, cache)[:3]
    s = cache.steps
    dropped, V = s["context"]  # (B, H, Lq, Lk) weights after dropout, (B, H, Lk, d)
    d_dropped, dV = F.attention_context_backward(d_out, s["context"])  # (B, H, Lq, Lk), (B, H, Lk, d)
    d_weights = F.dropout_backward(d_dropped, s["dropout"])  # (B, H, Lq, Lk)
    if conv.backward_dropout == "softmax-dropped":
        d_scores = F.softmax_backward(d_weights, dropped)  # the bug: the dropped weights in p (dp - sum(p dp))
    else:  # "dv-undropped"
        d_scores = F.softmax_backward(d_weights, s["softmax"])
        dV = cache.attn_weights.swapaxes(-1, -2) @ d_out  # (B, H, Lk, Lq) @ (B, H, Lq, d): P, not the dropped P
    d_scores = F.apply_mask_backward(d_scores, s["mask"])  # (B, H, Lq, Lk)
    dq, dK = F.attention_scores_backward(d_scores, s["scores"])  # (B, H, Lq, d), (B, H, Lk, d)
    return dq, dK, dV


def _masked_rows(t: Tensors, rows: np.ndarray, case: Case, nan: bool, nan_grad: bool = False) -> None:
    """Rows (B, H, Lq) treated otherwise than ours (NaN, uniform weights, or NaN in the backward only): what they
    reach and an implementation may compute either way is dont_care. A NaN row's output is NaN (required) and its
    weights dont_care (a blocked weight may come out 0 or NaN). In the backward, the scores' gradient on such a row
    is passed through (an added mask) or zeroed (a ``where`` on the scores, as JAX does), and a NaN spreads more or
    less far: those rows of dq, and every key of their kv head in dk (and in dv for NaN rows), are dont_care;
    ``nan_grad``: those rows of dq are NaN (required), the forward ours."""
    if not rows.any():
        return
    if nan:
        out = t.values["out"].copy()
        out[rows] = np.nan
        t.values = {**t.values, "out": out}
        t.dont_care["weights"] = np.broadcast_to(rows[..., None], t.values["weights"].shape)
    if "dq" not in t.values:
        return
    if nan_grad:
        dq = t.values["dq"].copy()
        dq[rows] = np.nan
        t.values = {**t.values, "dq": dq}
    else:
        t.dont_care["dq"] = np.broadcast_to(rows[..., None], t.values["dq"].shape)
    touched = rows.reshape(case.B, case.Hkv, case.H // case.Hkv, case.Lq).any(axis=(2, 3))  # grouped (B, Hkv)
    t.dont_care["dk"] = np.broadcast_to(touched[:, :, None, None], t.values["dk"].shape)
    if nan or nan_grad:
        t.dont_care["dv"] = t.dont_care["dk"]


# --------------------------------------------------------------------------- the alternatives


@dataclass(frozen=True)
class Alternative:
    """One known way of doing it differently: the convention's change, its name and what it means."""

    name: str
    change: dict
    text: str
    stage: str = "forward"  # "backward": only the gradients differ

    def convention(self, base: Convention = OURS) -> Convention:
        """``base`` with this alternative's change applied."""
        return replace(base, **self.change)


ALTERNATIVES = (
    Alternative("mask polarity", {"mask": "inverted"}, "reads the bool mask with the other polarity"),
    Alternative("mask added", {"mask": "added"}, "adds the bool mask to the scores as 0/1 instead of blocking"),
    Alternative(
        "causal top-left",
        {"causal": "top-left"},
        "is_causal aligned top-left (query i sees keys j <= i) instead of bottom-right (j <= i + Lk - Lq): wrong "
        "with a KV cache or chunked prefill whenever Lq != Lk",
    ),
    Alternative(
        "NaN rows",
        {"masked_rows": "nan"},
        "a fully masked row gives NaN (the softmax of a row of -inf) instead of zero weights and a zero output",
    ),
    Alternative(
        "NaN gradient rows",
        {"masked_rows": "nan-grad"},
        "a fully masked row is zero in the forward but NaN in the backward (a nan_to_num or torch.where after a "
        "softmax of -inf: the softmax's own backward is still NaN there; pytorch #41508)",
        "backward",
    ),
    Alternative(
        "uniform rows",
        {"masked_rows": "uniform"},
        "a fully masked row gets uniform weights 1/Lk instead of zeros: blocked entries get a finite minimum "
        "(finfo.min, -1e9), not -inf",
    ),
    Alternative("scale forgotten", {"scale": "forgotten"}, "no scale: softmax(q kᵀ) instead of softmax(q kᵀ · scale)"),
    Alternative("scale twice", {"scale": "twice"}, "the scale applied twice: softmax(q kᵀ · scale²)"),
    Alternative("scale ignored", {"scale": "default"}, "ignores the given scale and uses 1/sqrt(d)"),
    Alternative(
        "GQA interleaved",
        {"gqa": "interleaved"},
        "GQA heads interleaved (query head h reads kv head h % Hkv) instead of grouped (h // (H / Hkv), as torch's "
        "enable_gqa and Hugging Face's repeat_kv)",
    ),
    Alternative("dropout no rescale", {"dropout": "no-rescale"}, "dropout without the 1 / (1 - p) rescale"),
    Alternative("keep-mask inverted", {"dropout": "keep-inverted"}, "reads the dropout keep-mask as a drop-mask"),
    Alternative(
        "weights after dropout",
        {"weights": "after-dropout"},
        "returns the attention weights after dropout instead of before (as torch MHA and HF eager do)",
    ),
    Alternative(
        "softmax without max",
        {"softmax": "no-max"},
        "a softmax without the row max subtracted: exp overflows (NaN) at large logits",
    ),
    Alternative(
        "backward scale missing", {"backward_scale": "missing"}, "the backward forgets the scale in dq, dk", "backward"
    ),  # fmt: skip
    Alternative(
        "backward scale twice",
        {"backward_scale": "twice"},
        "the backward applies the scale twice in dq, dk",
        "backward",
    ),  # fmt: skip
    Alternative(
        "backward softmax after dropout",
        {"backward_dropout": "softmax-dropped"},
        "the backward's softmax step uses the weights after dropout instead of before",
        "backward",
    ),
    Alternative(
        "backward dv before dropout",
        {"backward_dropout": "dv-undropped"},
        "dv uses the weights before dropout instead of after",
        "backward",
    ),
)
# Not conventions but precisions: the error fits the budget of a lower dtype (``verify.detect`` tries them last).
LOWER = {"float64": ("float32", "float16", "bfloat16"), "float32": ("float16", "bfloat16"), "float16": (),
         "bfloat16": ()}  # fmt: skip
PRECISIONS = tuple(
    Alternative(
        f"{p} inside",
        {},
        f"the error is what our path makes in {p} (within that dtype's budget): a step "
        f"computes in {p}, e.g. the softmax or an accumulation",
        "precision",
    )  # fmt: skip
    for p in ("float32", "float16", "bfloat16")
)
LESS_EXACT = Alternative(
    "less exact",
    {},
    "right to within a few budgets, in no convention's pattern: a rounding difference (a less exact sum or exp, or "
    "a FlashAttention-style backward that recomputes the weights from the log-sum-exp), not a wrong convention",
    "precision",
)
BY_NAME = {a.name: a for a in ALTERNATIVES + PRECISIONS + (LESS_EXACT,)}


def applies(alt: Alternative, case: Case, x: CaseInputs, mask_convention: str, returns_weights: bool) -> bool:
    """Whether ``alt`` can change this case at all (a cheap test; ``detect`` also checks that its numbers differ)."""
    c = alt.change
    bool_mask = x.mask is not None and x.mask.dtype == np.bool_
    if "mask" in c:  # only a function that receives a bool mask can read it either way
        return bool_mask and mask_convention in ("attend", "ignore")
    if "causal" in c:
        return case.is_causal and case.Lq != case.Lk
    if "masked_rows" in c:
        return bool(blocked_rows(effective_mask(x.mask, case), (case.B, case.H, case.Lq, case.Lk)).any())
    if c.get("scale") == "default":
        return case.scale is not None
    if "gqa" in c:
        return 1 < case.Hkv < case.H
    if "dropout" in c or "backward_dropout" in c:
        return case.dropout_p > 0
    if "weights" in c:
        return case.dropout_p > 0 and returns_weights
    return True
