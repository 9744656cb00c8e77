"""The tolerance rule, derived: a function may be k times as far from the float64 reference as our plain path in
the same dtype is, plus a floor for what no implementation can avoid.

For each tensor T of a case (out, weights, dq, dk, dv), with ref the float64 reference (``conventions.reference``)
and plain our vectorized path run in the case's dtype on the same inputs (``plain``):

    error(T)  = max |T_fn - T_ref|
    budget(T) = k · max |T_plain - T_ref|  +  k · (eps_dtype · (1 + max |s|) + sqrt(n) · eps_float64) · max |T_ref|,
    k = 2, s the scores the softmax sees (blocked ones excepted)

The first term is flash-attention's rule (``tests/test_flash_attn.py``: the kernel's error at most twice that of a
PyTorch implementation in the same dtype, against a float32 reference). The floor's two terms are the two errors the
first term cannot see. ``eps_dtype · max |T_ref|``: rounding the result once to the dtype, which no implementation
avoids (flash-attention's ``fwd_atol = 2 · |(ref + 0.3) - 0.3 - ref|``); it matters where the plain path happens to
be exact (a zero row, a tiny tensor). The factor (1 + max |s|): a score s rounded in the dtype is off by up to eps ·
|s|, and the softmax turns that absolute error of its input into the same relative error of the weights, whatever
order the function sums in (at logits 1e4 in float64 this is the whole budget). ``sqrt(n) · eps_float64 · max
|T_ref|``: the float64 reference's own rounding, the probabilistic bound of a chain of inner products of total
length n (Higham and Mary 2019: error <= lambda sqrt(n) u), with n = d + Lk for out and weights (the scores' sum
over d, the softmax's and the context's over Lk) and n = d + Lq + Lk for the gradients (dk and dv sum over the
queries). In float32 and below it is far under the first term; in float64, where the plain path *is* the reference
and the first term is 0, it is the whole budget. max |T_ref| is the tensor's largest entry (a quantity that is zero
in theory is judged against the largest one, never against its own rounding); a tensor that is zero everywhere is
judged against the case's largest tensor.

float16 and bfloat16: NumPy's BLAS has neither, so the plain path runs in float32 and rounds every step's result
to the dtype (the scores, the masked scores, the weights, after dropout, the output; each gradient step), which is
what a GPU kernel with float32 accumulation does (and PyTorch's reference in that dtype).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .. import functional as F
from .cases import Case, CaseInputs
from .conventions import Tensors, collapse_kv, effective_mask, effective_scale, expand_kv, reference
from .dtypes import EPS, round_to

K = 2.0  # flash-attention's factor
TENSORS = ("out", "weights", "dq", "dk", "dv")


def reduction_length(name: str, case: Case) -> int:
    """n of the floor: the total length of the sums that make the tensor."""
    return case.d + case.Lk + (case.Lq if name in ("dq", "dk", "dv") else 0)


def floor_factor(name: str, case: Case, max_logit: float) -> float:
    """The floor over k, relative to max |T_ref|: eps · (1 + max|s|) + sqrt(n) · eps64."""
    return EPS[case.dtype] * (1.0 + max_logit) + math.sqrt(reduction_length(name, case)) * EPS["float64"]


@dataclass(frozen=True)
class Check:
    """One tensor of one case against its budget."""

    name: str
    error: float  # max |fn - ref|; inf when a NaN is on one side only, or the shape is wrong
    plain_error: float  # max |plain - ref|
    floor: float
    budget: float  # K · plain_error + floor

    @property
    def ratio(self) -> float:
        """The error as a multiple of the budget (<= 1 passes)."""
        if self.error == 0:
            return 0.0
        return self.error / self.budget if self.budget > 0 else math.inf

    @property
    def passed(self) -> bool:
        """True when the error is within the budget."""
        return self.ratio <= 1.0


def max_error(got, ref: np.ndarray, dont_care=None) -> float:
    """max |got - ref| over the entries not dont_care: NaN on both sides counts 0, on one side inf."""
    got, ref = np.asarray(got, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    if got.shape != ref.shape:
        return math.inf
    with np.errstate(invalid="ignore"):
        err = np.abs(got - ref)
    both = np.isnan(got) & np.isnan(ref)
    err = np.where(both | (got == ref), 0.0, np.where(np.isnan(err), np.inf, err))  # == : inf where inf is right
    if dont_care is not None:
        err = np.where(dont_care, 0.0, err)
    return float(err.max()) if err.size else 0.0


def largest(a: np.ndarray) -> float:
    """max |a| over the finite entries of ``a`` (0 when there is none)."""
    finite = np.abs(a[np.isfinite(a)])
    return float(finite.max()) if finite.size else 0.0


def check(got: dict, ref: Tensors, plain: Tensors, case: Case) -> dict[str, Check]:
    """Each tensor the function returned, against the reference with its budget."""
    scales = {n: largest(ref.values[n]) for n in got}
    fallback = max(scales.values(), default=0.0) or 1.0
    checks = {}
    for name, value in got.items():
        r = ref.values[name]
        plain_error = max_error(plain.values[name], r)
        scale = scales[name] or fallback
        floor = K * floor_factor(name, case, ref.max_logit) * scale
        checks[name] = Check(name, max_error(value, r, ref.dont_care.get(name)), plain_error, floor,
                             K * plain_error + floor)  # fmt: skip
    return checks


# --------------------------------------------------------------------------- our plain path in the case's dtype


def plain(x: CaseInputs, case: Case, backward: bool = True) -> Tensors:
    """Our vectorized path in the case's dtype: the kernel itself in float32 and float64; for float16 and
    bfloat16, functional's pairs (the kernel's composition) in float32, every step's result rounded to the dtype."""
    if case.dtype in ("float32", "float64"):
        return reference(x, case, dtype=case.dtype, backward=backward)
    r = lambda a: round_to(a, case.dtype).astype(np.float32)  # noqa: E731 - one rounding, named once
    q, k, v, d_out = (r(a) for a in (x.q, x.k, x.v, x.d_out))  # already the dtype's numbers, unless a float64
    K_, V = expand_kv(k, case.H), expand_kv(v, case.H)  # (B, H, Lk, d)    case is run at a lower precision
    mask, scale = effective_mask(x.mask, case), effective_scale(case)
    if mask is not None and mask.dtype != np.bool_:
        mask = r(mask)
    scores, _ = F.attention_scores_forward(q, K_, scale)  # F1: (B, H, Lq, Lk)
    masked, c_mask = F.apply_mask_forward(r(scores), mask)  # F2: (B, H, Lq, Lk)
    weights = r(F.softmax_forward(r(masked))[0])  # F3: (B, H, Lq, Lk)
    dropped, c_drop = F.dropout_forward(weights, case.dropout_p, keep_mask=x.keep)  # F4
    dropped = r(dropped)
    out = r(F.attention_context_forward(dropped, V)[0])  # F5: (B, H, Lq, d)
    values = {"out": out, "weights": weights}
    if backward:
        d_dropped, dV = F.attention_context_backward(d_out, (dropped, V))  # ← F5
        d_weights = r(F.dropout_backward(r(d_dropped), c_drop))  # ← F4
        d_scores = r(F.apply_mask_backward(r(F.softmax_backward(d_weights, weights)), c_mask))  # ← F3, F2
        dq, dK = F.attention_scores_backward(d_scores, (q, K_, scale))  # ← F1
        values.update(dq=r(dq), dk=r(collapse_kv(dK, case.Hkv)), dv=r(collapse_kv(r(dV), case.Hkv)))
    return Tensors(values)
