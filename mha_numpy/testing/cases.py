"""The case matrix: every shape, mask, option and dtype an attention implementation is run on, and its inputs.

A ``Case`` is plain data (its name says everything it holds); ``case.inputs()`` makes its arrays, the same on
every call (seeded by the case's name): q (B, H, Lq, d), k, v (B, Hkv, Lk, d), the upstream gradient d_out
(B, H, Lq, d), the mask in our convention (bool True = may attend, or float added; 4-D, broadcastable to
(B, H, Lq, Lk)) and the dropout keep-mask (B, H, Lq, Lk). Entries are standard normal, rounded to the case's
dtype, so the function and every reference see the same numbers.

``matrix("quick")`` (about 50 cases) and ``matrix("full")`` (about 500) cover, as flash-attention's
``tests/test_flash_attn.py`` and PyTorch's ``test_transformers.py`` do: head dims 8, 59, 64, 111, 128; (Lq, Lk)
from (1, 239) to (1023, 1024) and Lq > Lk; batch > 1 with padding; every mask kind (padding, causal aligned
top-left and bottom-right, sliding window, packed documents, rows blocked completely, an additive bias) in each
form (bool, -inf, the finite minimum Hugging Face adds); ``is_causal``; GQA and MQA; dropout with a given
keep-mask; a scale other than 1/sqrt(d); logits around 1e4; float64, float32, float16 and bfloat16.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, replace

import numpy as np

from .. import masks
from .dtypes import FINFO_MIN, round_to
from .extra_masks import blocked_rows_mask, document_mask

# what each mask kind is (our convention: True = may attend); the forms say how a blocked entry is written
MASK_KINDS = {
    "padding": "key padding: batch item b sees its first lengths[b] keys",
    "causal top-left": "key j <= query i (torch.tril, SDPA's is_causal)",
    "causal bottom-right": "key j <= i + Lk - Lq (a KV cache; the first Lq - Lk rows are blocked when Lq > Lk)",
    "causal bottom-right + padding": "the two at once (a batch of KV caches of different lengths)",
    "sliding window": "the last max(3, Lk // 8) keys up to i + Lk - Lq (Mistral's window, bottom-right)",
    "documents": "packed documents, causal within each (bottom-right), different per batch item",
    "blocked rows": "padding with a batch item of length 0, and the last queries of every item blocked",
    "bias": "an additive float bias N(0, 2^2) (B, H, Lq, Lk), such as ALiBi or a relative bias",
}
MASK_FORMS = ("bool", "-inf", "finfo.min")  # how a blocked entry is written: False, an added -inf, finfo(dtype).min
FEATURES = ("mask", "is_causal", "scale", "dropout", "gqa", "backward")  # what a case may need of a function


@dataclass(frozen=True)
class CaseInputs:
    """The arrays of one case, in the case's dtype (bfloat16 held as float32; see ``dtypes``)."""

    q: np.ndarray  # (B, H, Lq, d)
    k: np.ndarray  # (B, Hkv, Lk, d)
    v: np.ndarray  # (B, Hkv, Lk, d)
    d_out: np.ndarray  # (B, H, Lq, d), the upstream gradient
    mask: np.ndarray | None  # (b, 1 or H, Lq or 1, Lk), our convention; float masks in the case's dtype
    keep: np.ndarray | None  # (B, H, Lq, Lk) bool, True = keep (dropout)


@dataclass(frozen=True)
class Case:
    """One attention call. ``mask``: a key of ``MASK_KINDS`` or None; ``form``: one of ``MASK_FORMS``;
    ``is_causal``: causal by the flag, aligned bottom-right (query i sees keys j <= i + Lk - Lq); ``scale``: None
    for 1/sqrt(d); ``dropout_p`` > 0 with a given keep-mask; ``logits``: an offset added to every score (1e4:
    large logits)."""

    group: str
    dtype: str
    B: int
    H: int
    Hkv: int
    Lq: int
    Lk: int
    d: int
    mask: str | None = None
    form: str = "bool"
    is_causal: bool = False
    scale: float | None = None
    dropout_p: float = 0.0
    logits: float | None = None

    @property
    def name(self) -> str:
        """What the case holds, e.g. 'padding (-inf), dropout 0.2' (its shape and dtype are columns of their own)."""
        parts = []
        if self.mask:
            parts.append(self.mask + ("" if self.mask == "bias" or self.form == "bool" else f" ({self.form})"))
        if self.is_causal:
            parts.append("is_causal")
        if self.Hkv != self.H:
            parts.append(f"{'MQA' if self.Hkv == 1 else 'GQA'} {self.H}/{self.Hkv}")
        if self.dropout_p:
            parts.append(f"dropout {self.dropout_p:g}")
        if self.scale is not None:
            parts.append(f"scale {self.scale:g}")
        if self.logits is not None:
            parts.append(f"logits {self.logits:g}")
        return ", ".join(parts) or "no mask"

    @property
    def shape(self) -> str:
        """The case's sizes as text, e.g. 'B2 H4/2 3x5 d8' (H/Hkv when they differ)."""
        heads = f"{self.H}" if self.Hkv == self.H else f"{self.H}/{self.Hkv}"
        return f"B{self.B} H{heads} {self.Lq}x{self.Lk} d{self.d}"

    @property
    def id(self) -> str:
        """Unique in a matrix: name, dtype and shape (pytest's id and the --only filter match it)."""
        return f"{self.name} [{self.dtype} {self.shape}]"

    def __str__(self) -> str:
        return self.id

    @property
    def real_scale(self) -> float:
        """The scale the scores take: the case's, or 1/sqrt(d) when it gives none."""
        return 1.0 / math.sqrt(self.d) if self.scale is None else self.scale

    def needs(self) -> set[str]:
        """The features of ``FEATURES`` this case needs of a function (the backward is asked of every case)."""
        need = {"backward"}
        need |= {"mask"} if self.mask else set()
        need |= {"is_causal"} if self.is_causal else set()
        need |= {"scale"} if self.scale is not None else set()
        need |= {"dropout"} if self.dropout_p else set()
        need |= {"gqa"} if self.Hkv != self.H else set()
        return need

    def inputs(self) -> CaseInputs:
        """The case's arrays, seeded by its id (the same on every run): q, d_out (B, H, Lq, d), k, v (B, Hkv, Lk, d)."""
        rng = np.random.default_rng(zlib.crc32(self.id.encode()))
        B, H, Hkv, Lq, Lk, d = self.B, self.H, self.Hkv, self.Lq, self.Lk, self.d
        q, k, v = (
            rng.standard_normal((B, H, Lq, d)),
            rng.standard_normal((B, Hkv, Lk, d)),
            rng.standard_normal((B, Hkv, Lk, d)),
        )
        if self.logits is not None:  # every score gets + logits: feature 0 of q and k carries it
            q[..., 0], k[..., 0] = 100.0, self.logits / (100.0 * self.real_scale)
        d_out = rng.standard_normal((B, H, Lq, d))
        keep = rng.random((B, H, Lq, Lk)) >= self.dropout_p if self.dropout_p else None
        q, k, v, d_out = (round_to(x, self.dtype) for x in (q, k, v, d_out))
        return CaseInputs(q, k, v, d_out, self._mask(rng), keep)

    def _mask(self, rng) -> np.ndarray | None:
        if self.mask is None:
            return None
        B, H, Lq, Lk = self.B, self.H, self.Lq, self.Lk
        if self.mask == "bias":
            return round_to(2.0 * rng.standard_normal((B, H, Lq, Lk)), self.dtype)
        lengths = [max(1, Lk - (Lk * b) // B) for b in range(B)]  # Lk, then shorter: batch > 1 with padding
        allowed = {
            "padding": lambda: masks.padding_mask(lengths, Lk),
            "causal top-left": lambda: masks.causal_mask(Lq, Lk),
            "causal bottom-right": lambda: masks.causal_mask(Lq, Lk, diagonal=Lk - Lq),
            "causal bottom-right + padding": lambda: (
                masks.causal_mask(Lq, Lk, diagonal=Lk - Lq) & masks.padding_mask(lengths, Lk)
            ),
            "sliding window": lambda: masks.sliding_window_mask(Lq, Lk, max(3, Lk // 8), offset=Lk - Lq),
            "documents": lambda: document_mask([_documents(Lk, b) for b in range(B)], Lq, Lk),
            "blocked rows": lambda: blocked_rows_mask([0, *lengths[1:]], max(1, Lq // 4), Lq, Lk),
        }[self.mask]()
        allowed = allowed.reshape((1,) * (4 - allowed.ndim) + allowed.shape)  # 4-D, broadcastable
        if self.form == "bool":
            return allowed
        blocked = -np.inf if self.form == "-inf" else FINFO_MIN[self.dtype]
        return round_to(np.where(allowed, 0.0, blocked), self.dtype)


def _documents(Lk: int, b: int) -> list[int]:
    """Document lengths covering Lk keys, different per batch item b (three, then two, documents)."""
    if b % 2 == 0:
        return [Lk // 3, Lk // 3, Lk - 2 * (Lk // 3)]
    return [Lk // 2, Lk - Lk // 2]


# --------------------------------------------------------------------------- the matrix

HEAD_DIMS = (8, 59, 64, 111, 128)
LENGTHS = ((1, 239), (3, 799), (127, 512), (113, 203), (1023, 1024), (203, 113), (512, 127), (64, 64))
MASKED_SHAPES = ((3, 799), (113, 203), (127, 512), (203, 113))  # (Lq, Lk) with every mask
BLOCKING = [kind for kind in MASK_KINDS if kind != "bias"]


def _shape_case(group, dtype, Lq, Lk, d, **kw) -> Case:
    """B and H smaller on the big shapes: the matrix runs in seconds, the shape is what is tested there."""
    big = Lq * Lk >= 500_000
    B, H = kw.pop("B", 1 if big else 2), kw.pop("H", 2 if big else 3)
    return Case(group, dtype, B, H, kw.pop("Hkv", H), Lq, Lk, d, **kw)


def _quick() -> list[Case]:
    cases = []
    for Lq, Lk, d in ((1, 239, 8), (3, 799, 59), (113, 203, 111), (127, 512, 64), (1023, 1024, 128), (203, 113, 64)):
        cases.append(_shape_case("shapes", "float32", Lq, Lk, d))
    for Lq, Lk, d in ((113, 203, 59), (1, 239, 8), (512, 127, 128)):
        cases.append(_shape_case("shapes", "float64", Lq, Lk, d))
    for kind in BLOCKING:
        cases.append(Case("masks", "float32", 3, 2, 2, 113, 203, 64, mask=kind))
    cases.append(Case("masks", "float32", 3, 2, 2, 203, 113, 64, mask="causal bottom-right"))  # Lq > Lk: blocked rows
    for kind, form in (("padding", "-inf"), ("blocked rows", "-inf"), ("padding", "finfo.min")):
        cases.append(Case("masks", "float32", 3, 2, 2, 113, 203, 64, mask=kind, form=form))
    cases.append(Case("masks", "float32", 3, 2, 2, 113, 203, 64, mask="bias"))
    cases += [Case("masks", "float64", 3, 2, 2, 3, 799, 59, mask="causal bottom-right + padding"),
              Case("masks", "float64", 3, 2, 2, 113, 203, 64, mask="blocked rows")]  # fmt: skip
    for Lq, Lk, d in ((1, 239, 8), (127, 512, 64), (203, 113, 64), (64, 64, 64)):
        cases.append(_shape_case("is_causal", "float32", Lq, Lk, d, is_causal=True))
    cases.append(_shape_case("is_causal", "float64", 3, 799, 59, is_causal=True))
    cases += [Case("gqa", "float32", 2, 8, 2, 113, 203, 64, is_causal=True),
              Case("gqa", "float32", 3, 4, 1, 113, 203, 64, mask="padding"),
              Case("gqa", "float64", 2, 6, 3, 3, 799, 59)]  # fmt: skip
    cases += [Case("dropout", "float32", 3, 2, 2, 113, 203, 64, mask="padding", dropout_p=0.2),
              Case("dropout", "float64", 2, 3, 3, 127, 512, 59, dropout_p=0.3)]  # fmt: skip
    cases += [Case("scale", "float32", 2, 3, 3, 113, 203, 59, scale=0.3),
              Case("scale", "float64", 2, 3, 3, 3, 799, 64, scale=1.0)]  # fmt: skip
    cases += [Case("logits", "float32", 2, 3, 3, 127, 512, 64, logits=1e4),
              Case("logits", "float32", 2, 3, 3, 113, 203, 64, mask="causal bottom-right", logits=1e4)]  # fmt: skip
    for dtype in ("float16", "bfloat16"):
        cases += [Case("half", dtype, 2, 3, 3, 113, 203, 64),
                  Case("half", dtype, 3, 2, 2, 113, 203, 64, mask="padding"),
                  Case("half", dtype, 3, 2, 2, 113, 203, 64, mask="blocked rows"),
                  _shape_case("half", dtype, 127, 512, 64, is_causal=True)]  # fmt: skip
    return cases


def _full() -> list[Case]:
    cases = []
    for dtype in ("float32", "float64", "float16", "bfloat16"):
        for Lq, Lk in LENGTHS:
            for d in HEAD_DIMS:
                cases.append(_shape_case("shapes", dtype, Lq, Lk, d))
    for dtype in ("float32", "float64", "float16", "bfloat16"):
        for Lq, Lk in MASKED_SHAPES:
            d = 64 if Lq != 3 else 59
            for kind in BLOCKING:
                if kind == "documents" and Lq > Lk:
                    continue  # packed documents are self-attention or a cache: Lq <= Lk
                forms = MASK_FORMS if dtype in ("float32", "float64") else ("bool",)
                for form in forms:
                    cases.append(Case("masks", dtype, 3, 2, 2, Lq, Lk, d, mask=kind, form=form))
            cases.append(Case("masks", dtype, 3, 2, 2, Lq, Lk, d, mask="bias"))
    for dtype in ("float32", "float64", "float16", "bfloat16"):
        for Lq, Lk in LENGTHS:
            for d in (59, 128) if dtype in ("float32", "float64") else (64,):
                cases.append(_shape_case("is_causal", dtype, Lq, Lk, d, is_causal=True))
    for dtype in ("float32", "float64"):
        for H, Hkv in ((8, 2), (8, 1), (6, 3), (4, 2)):
            for extra in ({}, {"is_causal": True}, {"mask": "padding"}, {"mask": "blocked rows"}):
                cases.append(Case("gqa", dtype, 2, H, Hkv, 113, 203, 64, **extra))
        for p in (0.1, 0.5):
            for extra in ({}, {"mask": "padding"}, {"mask": "causal bottom-right"}, {"mask": "blocked rows"}):
                cases.append(Case("dropout", dtype, 3, 2, 2, 113, 203, 64, dropout_p=p, **extra))
        for scale in (0.3, 1.0, 2.5):
            for Lq, Lk, d in ((113, 203, 59), (3, 799, 128)):
                cases.append(Case("scale", dtype, 2, 3, 3, Lq, Lk, d, scale=scale))
    for dtype in ("float32", "float64"):  # float16 and bfloat16 cannot hold logits near 1e4 (bfloat16's spacing
        for logits in (1e3, 1e4):  # there is 64): our plain path's error is the size of the tensors, no budget at all
            for extra in ({}, {"mask": "causal bottom-right"}, {"is_causal": True}):
                cases.append(Case("logits", dtype, 2, 3, 3, 127, 512, 64, logits=logits, **extra))
    return cases


MATRICES = {"quick": _quick, "full": _full}


def matrix(cases: str = "quick") -> list[Case]:
    """The cases of the ``quick`` or ``full`` matrix, in a fixed order."""
    if cases not in MATRICES:
        raise ValueError(f"cases must be one of {tuple(MATRICES)}, got {cases!r:.60}")
    return MATRICES[cases]()


def shrink(case: Case, factor: int = 16) -> Case:
    """The same case with shorter sequences, for a CI that runs on every commit: L -> L // factor + 1 (lengths up
    to 3 kept), so Lq < Lk, Lq = Lk, Lq > Lk and Lq = 1 stay what they were; everything else (head dim, heads,
    mask, options, dtype) unchanged. ``[shrink(c) for c in matrix("quick")]`` runs in about a tenth of the time."""

    def short(n: int) -> int:
        return max(min(n, 3), n // factor + 1)

    return replace(case, Lq=short(case.Lq), Lk=short(case.Lk))
