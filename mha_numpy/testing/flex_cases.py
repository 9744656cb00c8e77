"""The cases of ``verify_flex``: FlexAttention calls of a few shapes, each a ``Case`` (float64) named by what it is
for: batch 2 with Lq < Lk, Lq > Lk, GQA when asked, and a row the mask blocks entirely where the mask_mod blocks
one at some shape (a mask_mod that blocks no row at any of them is said in the report's notes)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .cases import Case


@dataclass(frozen=True)
class FlexCase(Case):
    """One FlexAttention call: a ``Case`` (its shape, float64) with what it is for (``what``, its name)."""

    what: str = ""

    @property
    def name(self) -> str:
        """What the case is for (its row's name; the id adds dtype and shape)."""
        return self.what

    @property
    def enable_gqa(self) -> bool:
        """Whether the call needs torch's ``enable_gqa`` (fewer key heads than query heads)."""
        return self.Hkv != self.H


def flex_cases(mask_mod=None, heads: int = 4, gqa: bool = False, d: int = 8) -> list[FlexCase]:
    """The cases: batch 2 with Lq < Lk, Lq > Lk, a GQA case (heads/2 key heads) if ``gqa``, and one where
    ``mask_mod`` (NumPy) blocks a whole row if none does yet and one of a few shapes has such a row."""
    mask = None if mask_mod is None else "mask_mod"

    def case(what, B, Hkv, Lq, Lk):
        """(the case, whether mask_mod blocks a whole row in it)."""
        blocked = mask_mod is not None and _blocks_a_row(mask_mod, (B, heads, Lq, Lk))
        what += ", a fully masked row" if blocked else ""
        return FlexCase("flex", "float64", B, heads, Hkv, Lq, Lk, d, mask=mask, what=what), blocked

    made = [case("batch 2, Lq < Lk", 2, heads, 7, 9), case("Lq > Lk", 1, heads, 9, 6)]
    if gqa:
        if heads % 2:
            raise ValueError(f"gqa=True needs an even number of heads, got heads={heads}")
        made.append(case(f"GQA {heads}/{heads // 2}", 2, heads // 2, 7, 9))
    if mask_mod is not None and not any(blocked for _, blocked in made):
        for B, Lq, Lk in ((2, 12, 4), (2, 4, 12), (2, 16, 16)):
            extra = case("a row the mask blocks", B, heads, Lq, Lk)
            if extra[1]:
                made.append(extra)
                break
    return [c for c, _ in made]


def _blocks_a_row(mask_mod, shape) -> bool:
    """Whether mask_mod (NumPy, on index arrays broadcastable to ``shape``) blocks some query row entirely."""
    try:
        allowed = np.broadcast_to(np.asarray(mask_mod(*np.ix_(*(np.arange(n) for n in shape)))), shape)
    except Exception:  # noqa: BLE001 - a mask that cannot run at this shape: the cases say so when they run it
        return False
    return allowed.dtype == np.bool_ and bool((~allowed.any(axis=-1)).any())
