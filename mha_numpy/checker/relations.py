"""Say how a wrong gradient (or output) relates to the right one, before looking for it in the catalogue of ``bugs``.

A catalogue names only the mistakes somebody wrote into it; most wrong gradients are the right one bent in a simple
way. Each finder below takes the student's ``got`` and the reference's ``want`` (and what it needs of the case) and
returns the end of a sentence, or None:

- ``missing``: None or all zeros where the reference is non-zero (``zeros_for_none``: zeros where it is None);
- ``constant_factor``: got = c · want, c fitted by least squares and named (``factor_names``: √d, 1/√d, the scale,
  the call's own numbers such as cap, n_rep, 1 − p; then, only when none fits, every size of the case's arrays that
  does: the batch, the heads, N, L, 2), −1, or given as a number; ``agreed_factor``: a factor found on several
  cases named only by the labels that fit it on every one (the runner's, after the cases);
- ``swapped_axes``: got = want with its axes permuted (a transpose; of equal sizes, the shape does not show it);
- ``reordered``: want's slices along one axis in another order (np.tile for np.repeat, two halves swapped);
- ``scrambled``: want's values, each once, in other places (a reshape where a transpose belongs);
- ``summed_wrong``: got summed over some axes is want (a sum missing: a bias gradient per position), or got is want
  summed over an axis (a sum too many);
- ``wrong_axis``: got = the right computation with one reduction over another axis (``axes``: {which sum or mean
  over which axis instead of which: the gradient so computed}, ``pair_hints.axes``);
- ``transposed_weight``: got = the right one with one path (or several) taken through its weight transposed (a
  square W, so no shape complains: dq @ W_qᵀ where the forward's x @ W_qᵀ gives back dq @ W_q); ``weights``: {the
  paths and weights so misread: the gradient so computed}, ``pair_hints.transposed_weights``;
- ``known_variant``: got = one of ``variants`` {what the code did, said whole: the output so computed}, given by
  the caller for a forward (``pair_hints.forward_variants``: a table read at the mirrored distance);
- ``missing_path``: got = want − one or more paths' contributions, or want + (c − 1) · one path (a factor or a sign
  on one path only); ``paths``: {what the path is: its contribution}, given by the caller for each gradient
  (``pair_hints`` for the pairs, ``Capstone.paths`` for the capstones);
- ``wrong_on_part``: right everywhere except on the fully masked rows, on a part the caller names (``parts``: the
  blocked or dropped entries, repeated ids, a key block, the clipped ends of a table), the first or last row, or one
  head (one index of one axis);
- ``elementwise_factor``: got = want / A or want · A entry by entry, A one of the case's arrays (``arrays``: the
  softmax's p, the delta rule's decay a_t, LayerNorm's rstd): a chain rule's factor forgotten or applied twice;
- ``varying_factor``: got = c · want with c changing along one axis (per head) or from row to row (a normaliser);
- ``from_error``: for a function that raised, what NumPy's message says of the code (inner sizes of a product that
  differ: a transpose; shapes that do not broadcast: a keepdims; a reshape of another size; an index past the end).

``explain`` runs them in that order and says the first relation found: the gradient, where it is computed (a pair's
backward or forward, or a capstone's F-line) and the direction of the fix, never the expected value. It says nothing
of a right answer. Every test of "equal" is the checker's: the absolute error against ``RTOL`` times the largest
magnitude of the case. The search runs only on a wrong gradient and is bounded (``MAX_SUBSETS`` combinations of paths
or axes, ``MAX_SLICES``, ``MAX_NDIM``): a hostile array cannot make it slow. A forward whose cache is what is wrong
is told by the runner itself (``runner._right_on_reference_cache``: the backward is right on the reference's cache).
"""

from __future__ import annotations

import itertools
import re

import numpy as np

from .diagnose import RTOL

MAX_SUBSETS = 64  # combinations of paths or axes tried (a gradient has a handful of paths; six give 63)
MAX_SLICES = 64  # the longest axis searched for a reordering (n² slice comparisons)
MAX_GROWTH = 64  # a got this many times larger than the right one is related to nothing (a hostile array)
MAX_NDIM = 6  # the most axes a got is searched over (the course's arrays have at most 5): the search stays bounded


def _close(a, b, scale: float) -> bool:
    return a.shape == b.shape and bool(np.all(np.abs(a - b) <= RTOL * scale))


def _nonzero(a, scale: float) -> bool:
    return bool(a.size) and not bool(np.all(np.abs(a) <= RTOL * scale))  # NaN is not zero


def missing(got, want, scale: float) -> str | None:
    """None, or an array of zeros, where the reference is non-zero."""
    if not _nonzero(want, scale):
        return None
    if got is None:
        return "is missing (None was returned) where the right gradient is non-zero: compute and return it"
    if got.shape == want.shape and not _nonzero(got, scale):
        return "is all zeros where the right gradient is not: this input does change the output, propagate to it"
    return None


def zeros_for_none(got) -> str | None:
    """An array of zeros returned for an input the call did not give (no bias): the convention is None there."""
    if got is None or not np.issubdtype(np.asarray(got).dtype, np.number) or np.any(np.asarray(got)):
        return None
    return "is an array of zeros where the call gave no such input: return None in its place"


class Factors(dict):
    """{label: value} of the factors worth naming; ``shapes``: the labels that are only sizes of the case's arrays (the
    batch, the heads, N, 2): said when no factor of the computation itself (√d, the scale, an argument) fits."""

    shapes: frozenset = frozenset()


def factor_names(shapes: dict | None = None, **sizes) -> Factors:
    """{label: value} of the factors worth naming: for each size given, in its order (``d=4`` gives √d, 1/√d, d, 1/d;
    ``scale=0.5`` gives scale and 1/scale; ``**{"the batch size": 2}`` gives it and its inverse), then those of
    ``shapes`` (the sizes of the case's arrays: the batch, N, the heads), then 2 and 1/2, these last two groups
    named only when the first has no name for the factor. −1 and the negatives are ``constant_factor``'s."""
    names, shaped = Factors(), set()
    for group, given in ((False, sizes), (True, shapes or {})):
        for label, value in given.items():
            if not value or value == 1:
                continue
            if label == "d":
                new = {"√d": np.sqrt(value), "1/√d": 1 / np.sqrt(value), "d": float(value), "1/d": 1 / value}
            elif label == "scale":
                new = {"scale": float(value), "1/scale": 1 / value}
            elif label.split(" (")[0].isidentifier():  # an argument of the call (cap, p, n_rep), or "N (the rows)"
                new = {label: float(value), f"1/{label}": 1 / value}
            else:
                new = {label: float(value), f"1/({label})": 1 / value}
            names.update({k: v for k, v in new.items() if k not in names})
            shaped |= set(new) if group else set()
    names.update({"2": 2.0, "1/2": 0.5})
    names.shapes = frozenset(shaped | {"2", "1/2"})
    return names


def _factor_words(c: float, names: dict[str, float] | None) -> tuple[str, str]:
    """(c said: its names and value when it is one of ``names`` or minus one, else the number; the inverse that fixes
    it, named the same way). Every name of that value is said, in ``names``' order, the sizes of the arrays only when
    nothing else fits (``Factors.shapes``; 2 and 1/2 always): on a case where √d, the batch and the heads are all 2,
    "√d or 2"."""
    shapes = getattr(names, "shapes", frozenset())
    table = {**(names or {}), **{f"−{k}": -v for k, v in (names or {}).items()}}

    def said(value: float) -> str:
        labels = [k for k, v in table.items() if abs(value / v - 1) <= 1e-6]
        first = [k for k in labels if k.lstrip("−") not in shapes]
        plain = [k for k in labels if k.lstrip("−") in ("2", "1/2")]  # a doubled term is as likely as any size
        return " or ".join((first + plain) if first else labels)

    named, fix = said(c), said(1 / c)
    return (f"{named} (= {c:.6g})" if named else f"{c:.6g}"), fix or f"{1 / c:.6g}"


def constant_factor(got, want, scale: float, names: dict[str, float] | None = None) -> str | None:
    """got = c · want for one constant c ≠ 1 (least squares, residual below the tolerance); c named when it is one of
    ``names`` (or minus one of them)."""
    if got.shape != want.shape or not _nonzero(want, scale) or not _nonzero(got, scale):
        return None
    c = float(np.vdot(want, got) / np.vdot(want, want))
    if abs(c - 1) <= 1e-6 or not _close(got, c * want, scale):
        return None
    if abs(c + 1) <= 1e-6:
        return "has the wrong sign (it is −1 times the right one): flip the sign where it is computed"
    said, fix = _factor_words(c, names)
    way = "too large" if abs(c) > 1 else "too small"
    sign = ", and of the wrong sign" if c < 0 else ""
    return f"is {said} times the right one ({way}{sign}): a factor {fix} is missing where it is computed"


FACTOR_SAID = re.compile(
    r" is (?P<said>[^:;]+?) \(= (?P<c>[-+0-9.e]+)\) times the right one \([^)]*\): a factor (?P<fix>.+?) is missing"
)


def agreed_factor(said: list[tuple[str, dict]]) -> str:
    """The first case's sentence of ``said`` [(sentence, the case's factor names)], its factor named only by the
    labels that fit the factor found on every case: a label is a guess from one case (√d = the heads = 2 on the
    first), the bug is the same on all (√3 ≠ 2 on the second). Unchanged when a sentence is not a constant factor's,
    or no label fits every case."""
    found = [(FACTOR_SAID.search(sentence), names) for sentence, names in said]
    if len(found) < 2 or not all(m and names for m, names in found):
        return said[0][0] if said else ""
    cs = [abs(float(m["c"])) for m, _ in found]  # as said: to 6 digits, so a label fits to 1e-5

    def fits(label: str, inverse: bool) -> bool:
        return all(label in names and abs((1 / names[label] if inverse else names[label]) / c - 1) <= 1e-5
                   for (_, names), c in zip(found, cs))  # fmt: skip

    first, names = found[0][0], found[0][1]
    direct = [k for k in names if fits(k, False)]
    kept = Factors({k: names[k] for k in direct + [k for k in names if fits(k, True)]})
    kept.shapes = frozenset(getattr(names, "shapes", frozenset()) & set(kept))
    if not direct or not any(k not in ("2", "1/2") for k in kept):
        return said[0][0]
    c = float(np.copysign(names[direct[0]], float(first["c"])))  # the label's exact value, not the 6 digits said
    words, fix = _factor_words(c, kept)
    sentence = said[0][0]
    middle = sentence[first.end("c") + 1 : first.start("fix")]  # " times the right one (...): a factor "
    return sentence[: first.start("said")] + words + middle + fix + sentence[first.end("fix") :]


def swapped_axes(got, want, scale: float) -> str | None:
    """got = want with its axes permuted (a transpose, or two axes swapped; of equal size, the shape hides it)."""
    if got.ndim != want.ndim or not 2 <= got.ndim <= MAX_NDIM or not _nonzero(want, scale):
        return None
    for perm in itertools.permutations(range(want.ndim)):  # at most 6! = 720
        moved = want.transpose(perm)
        if perm == tuple(range(want.ndim)) or moved.shape != got.shape:
            continue
        if _close(got, moved, scale) and not _close(want, moved, scale):
            if want.ndim == 2:
                return "is the transpose of the right one: swap the two factors of its product (or transpose it)"
            swapped = [i for i, p in enumerate(perm) if p != i]
            return f"has its axes {tuple(swapped)} swapped: put them back in the forward's order"
    return None


def reordered(got, want, scale: float) -> str | None:
    """got holds want's slices along one axis in another order (heads repeated as np.tile where np.repeat belongs,
    rows reversed, the two halves of rotate_half swapped): every slice of got is one of want's, and every one of
    want's is there."""
    if got.shape != want.shape or not _nonzero(want, scale):
        return None
    for axis in range(want.ndim):
        n = want.shape[axis]
        if not 2 <= n <= MAX_SLICES:
            continue
        g, w = np.moveaxis(got, axis, 0).reshape(n, -1), np.moveaxis(want, axis, 0).reshape(n, -1)
        same = np.all(np.abs(g[:, None, :] - w[None, :, :]) <= RTOL * scale, axis=-1)  # (n, n): slice i is want's j
        if same.any(axis=1).all() and same.any(axis=0).all() and not same[np.arange(n), np.arange(n)].all():
            i = int(np.flatnonzero(~same[np.arange(n), np.arange(n)])[0])
            j = int(np.flatnonzero(same[i])[0])
            what = "heads" if axis == 1 and want.ndim == 4 else f"indices of axis {axis}"
            return (
                f"has the right {what} in another order (index {i} holds what belongs at index {j}): look at how "
                "that axis is ordered (np.repeat against np.tile, a reshape's order, a reversed range)"
            )
    return None


def scrambled(got, want, scale: float) -> str | None:
    """got holds want's values, each once, in other places (of the same size; no axis permuted nor reordered: those
    are told first): a reshape where a transpose belongs, or the reverse."""
    if got.size != want.size or got.size < 2 or not _nonzero(want, scale) or np.ptp(want) <= RTOL * scale:
        return None
    if not bool(np.all(np.abs(np.sort(got, axis=None) - np.sort(want, axis=None)) <= RTOL * scale)):
        return None
    return (
        "has the right values in other places (the same entries, moved): a reshape where a transpose belongs, or "
        "a transpose where a reshape belongs; follow the forward's reshapes and transposes back in reverse order"
    )


def _subsets(axes):
    return itertools.chain.from_iterable(itertools.combinations(axes, r) for r in range(1, len(axes) + 1))


def summed_wrong(got, want, scale: float) -> str | None:
    """A sum missing (got summed over some of its axes is want) or a sum too many (got is want summed over an axis,
    with or without the axis kept)."""
    if not _nonzero(want, scale):
        return None
    if want.ndim <= got.ndim <= MAX_NDIM and got.size > want.size:  # a hostile (1,) * 40 would take 2⁴⁰ subsets
        for axes in itertools.islice(_subsets(range(got.ndim)), MAX_SUBSETS):
            summed = got.sum(axis=axes)
            if summed.size == want.size and _close(np.squeeze(summed), np.squeeze(want), scale):
                return (f"has shape {got.shape}: it is the per-item part of the right one, not summed over axes "
                        f"{axes}: every item along them uses the same input, so the contributions add up")  # fmt: skip
    for axes in itertools.islice(_subsets(range(want.ndim)), MAX_SUBSETS):
        summed = want.sum(axis=axes, keepdims=True)
        dropped = summed.reshape([n for i, n in enumerate(want.shape) if i not in axes])
        for seen in (dropped, summed, np.broadcast_to(summed, want.shape)):  # the last: summed, then spread back
            if _close(got, seen, scale) and not _close(want, np.broadcast_to(summed, want.shape), scale):
                return (f"is summed over axes {axes}, a sum too many: each item along them has a gradient of "
                        "its own, keep those axes apart")  # fmt: skip
    return None


def wrong_axis(got, want, scale: float, axes: dict[str, np.ndarray] | None = None) -> str | None:
    """got is the right computation with one reduction (a sum, a mean) taken over another axis: ``axes`` {what was
    reduced over which axis instead of which: the gradient so computed}, given by the caller (``pair_hints.axes``)."""
    for said, variant in (axes or {}).items():  # a variant of another shape than want's: a grouping's sum misread
        if _close(got, variant, scale) and not _close(want, variant, scale):
            return f"is right with {said}: that reduction runs over the wrong axis, take it over the forward's"
    return None


def transposed_weight(got, want, scale: float, weights: dict[str, np.ndarray] | None = None) -> str | None:
    """got is the right gradient with a path taken through its weight transposed: ``weights`` {which path uses
    which weight's transpose where which belongs: the gradient so computed}, given by the caller
    (``pair_hints.transposed_weights``)."""
    for said, variant in (weights or {}).items():
        if variant.shape == want.shape and _close(got, variant, scale) and not _close(want, variant, scale):
            return (f"is right except that {said}: it lacks the contribution of that path through the weight the "
                    "forward multiplied by, and holds the transposed weight's in its place; a forward x @ Wᵀ gives "
                    "back d @ W")  # fmt: skip
    return None


def known_variant(got, want, scale: float, variants: dict[str, np.ndarray] | None = None) -> str | None:
    """got is one of ``variants`` {the end of the sentence, what the code did and where to look: the output so
    computed}, and the right answer is not."""
    for said, variant in (variants or {}).items():
        if variant.shape == want.shape and _close(got, variant, scale) and not _close(want, variant, scale):
            return said
    return None


def missing_path(got, want, scale: float, paths: dict[str, np.ndarray] | None = None, names=None) -> str | None:
    """got = want − the contributions of one or more paths (``paths``: {what the path is: its contribution to this
    gradient}); the fewest paths that explain it are named. Else got = want + (c − 1) · one path: that path's part
    is c times its right value (a factor, a sign, on one path only), c named as ``constant_factor`` names it."""
    if got.shape != want.shape:
        return None
    parts = {}
    for k, v in (paths or {}).items():
        try:
            v = np.broadcast_to(np.asarray(v, dtype=np.float64), want.shape)  # a term constant along an axis
        except ValueError:
            continue
        if _nonzero(v, scale):
            parts[k] = v
    for lost in itertools.islice(_subsets(list(parts)), MAX_SUBSETS):
        if _close(got, want - sum(parts[k] for k in lost), scale):
            several = len(lost) > 1
            what = f"contribution{'s' * several} of {' and '.join(lost)}"
            it = "them" if several else "it"
            return f"lacks the {what}: the right one sums {it} with the rest, add {it}"
    for k, part in parts.items():
        c = 1 + float(np.vdot(part, got - want) / np.vdot(part, part))
        if abs(c - 1) <= 1e-6 or abs(c) <= 1e-6 or not _close(got, want + (c - 1) * part, scale):
            continue
        if abs(c + 1) <= 1e-6:
            return f"has the contribution of {k} with the wrong sign (the rest is right): flip the sign on that path"
        said, fix = _factor_words(c, names)
        return (f"has the contribution of {k} {said} times its right value (the rest is right): a factor {fix} "
                "is missing on that path")  # fmt: skip
    return None


def wrong_on_part(got, want, scale: float, masked_rows=None, parts=None) -> str | None:
    """Right everywhere but on the fully masked rows (``masked_rows``: bool, True for a row with no key allowed,
    broadcastable to got.shape[:-1]), on one of ``parts`` ({what the part is and where to look: bool, True on the
    part, broadcastable to got.shape}: the first that holds every wrong entry and is not the whole), on the first
    row, on one head, or on one index of one axis."""
    if got.shape != want.shape or got.ndim < 2:
        return None
    with np.errstate(invalid="ignore"):
        err = np.abs(got - want)
    bad = ~(err <= RTOL * scale)  # NaN is bad
    if not bad.any() or bad.all():
        return None
    if masked_rows is not None:
        try:
            rows = np.broadcast_to(np.asarray(masked_rows, dtype=bool), want.shape[:-1])
        except ValueError:
            rows = None
        if rows is not None and rows.any() and np.array_equal(bad.any(axis=-1), rows):
            return (
                "is wrong only on the fully masked rows (no key allowed): there the weights are zero, and so are the "
                "context and the gradients; handle those rows without dividing by a zero sum or using -inf"
            )
    part = None
    for label, where in (parts or {}).items():
        try:
            region = np.broadcast_to(np.asarray(where, dtype=bool), want.shape)
        except ValueError:
            continue
        if region.any() and not region.all() and not (bad & ~region).any():
            part = (f"is wrong only on {label}", int(region.sum()))
            break
    index = _one_index(bad, want)
    if part and index and index[1] < part[1]:  # the smaller place that holds every wrong entry says more
        return index[0]
    return (part or index or (None,))[0]


ONE_INDEX = " is right except "  # the words of ``_one_index``'s sentences: a place, weaker than a catalogue match


def _one_index(bad, want) -> tuple[str, int] | None:
    """(the sentence, the entries of that slice) when every wrong entry is at one index of one axis: the first row,
    the last row, one head, or an index of an axis; None otherwise."""
    for axis in [want.ndim - 2, *([1] if want.ndim == 4 else []), *range(want.ndim)]:
        if want.shape[axis] < 2:
            continue
        hit = np.flatnonzero(np.moveaxis(bad, axis, 0).reshape(want.shape[axis], -1).any(axis=1))
        if len(hit) != 1:
            continue
        i, size = int(hit[0]), want.size // want.shape[axis]
        rows = want.ndim >= 3 and axis == want.ndim - 2  # positions of a sequence (a table's row 0 is token 0)
        if rows and i == 0:
            return "is right except on the first row (index 0 of axis -2): look at how the first row is treated", size
        if rows and i == want.shape[axis] - 1:
            return "is right except on the last row (axis -2): look for a loop that stops one row early", size
        if axis == 1 and want.ndim == 4:
            return f"is right except on head {i} (axis 1): look at how that head is indexed", size
        if axis == 0 and want.ndim == 2:  # a table's or a weight's row (an embedding's row 0 is token 0)
            return f"is right except on row {i} (index {i} of axis 0): look at how that row is treated", size
        return f"is right except at index {i} of axis {axis}: look at how that slice is treated", size
    return None


def varying_factor(got, want, scale: float) -> str | None:
    """got = c · want with c not one constant: one factor per index of one axis (per head, per batch item), or one
    per row of the last axis (a row's normaliser wrong: a sum over the keys with a term missing or extra)."""
    if got.shape != want.shape or got.ndim < 2 or not _nonzero(want, scale) or not _nonzero(got, scale):
        return None
    rows = () if want.shape[-1] < 3 else ("row",)  # a row of 1 or 2 entries fits any factor: nothing to tell
    for axis in [*(a for a in range(want.ndim) if 1 < want.shape[a] <= want.size // 3), *rows]:  # ≥ 3 a factor
        over = (want.ndim - 1,) if axis == "row" else tuple(i for i in range(want.ndim) if i != axis)
        num, den = (got * want).sum(axis=over, keepdims=True), (want * want).sum(axis=over, keepdims=True)
        c = np.where(den > 0, num / np.where(den > 0, den, 1.0), 1.0)
        used = c[den > (RTOL * scale) ** 2]
        if used.size < 2 or np.ptp(used) <= 1e-6 * np.abs(used).max() or not _close(got, c * want, scale):
            continue
        if axis == "row":
            return ("is, row by row (over the last axis), the right row times a factor of its own: a quantity "
                    "of each row is wrong, a normaliser (a softmax's sum, a sink's term, 1/ℓ) or a decay")  # fmt: skip
        what = "head" if axis == 1 and want.ndim == 4 else f"index of axis {axis}"
        return f"is the right one times a factor that changes from one {what} to the next: look at what that axis holds"
    return None


def elementwise_factor(got, want, scale: float, arrays: dict | None = None) -> str | None:
    """got = want / A or want · A entry by entry for one of ``arrays`` ({what A is: A}, broadcastable to want): a
    factor of the chain rule forgotten (p, a decay) or applied twice. Tested as got · A = want (no division by 0)."""
    for label, A in (arrays or {}).items():
        try:
            A = np.broadcast_to(np.asarray(A, dtype=np.float64), want.shape)
        except ValueError:
            continue
        if got.shape != want.shape or np.ptp(A) <= 1e-9 * (np.abs(A).max() or 1.0):  # one constant: not this finder's
            continue
        if _close(got * A, want, scale):
            return f"is the right one divided by {label}, entry by entry: a factor {label} is missing there"
        if _close(got, want * A, scale):
            return f"is the right one times {label}, entry by entry: a factor {label} too many"
    return None


# (a piece of NumPy's message, what it says of the code), the piece near the start: a child sends 100 characters
ERRORS = (
    ("matmul: Input operand", "a matrix product whose inner sizes differ: one factor needs its last two axes swapped "
     "(swapaxes(-1, -2)), or the two factors are in the wrong order"),
    ("not aligned", "a matrix product whose inner sizes differ: one factor needs its transpose, or the two are in the "
     "wrong order"),
    ("could not be broadcast", "two arrays whose shapes do not broadcast: a sum without keepdims=True, or an axis left "
     "in the wrong place"),
    ("cannot reshape array", "a reshape to a shape of another size: read the sizes from the array (or the cache) it "
     "reshapes"),
    ("axes don't match array", "a transpose given another number of axes than the array has: .T reverses every axis, "
     "swapaxes(-1, -2) swaps the last two"),
    ("out of bounds for axis", "an index past the end of an axis: a loop or a slice one step too far"),
    ("too many indices for array", "more indices than the array has axes: an axis indexed that the array does not "
     "have"),
)  # fmt: skip


def from_error(function: str, message: str) -> str:
    """For a student's function that raised: what NumPy's ``message`` says of the code, as one sentence ("" when it is
    none of ``ERRORS``)."""
    said = next((what for piece, what in ERRORS if piece in message), "")
    return f"{function} raised: {said}." if said else ""


def _safely(finder) -> str | None:
    try:
        return finder()
    except (ValueError, TypeError, ArithmeticError):  # a student's array no finder expected: no relation, no crash
        return None


def explain(gradient: str, where: str, got, want, scale: float, *, names=None, paths=None, masked_rows=None,
            parts=None, arrays=None, axes=None, weights=None, variants=None):  # fmt: skip
    """The first relation between the student's ``got`` and the reference's ``want``, as one sentence naming
    ``gradient`` and ``where`` (a backward, an F-line), or "" when none holds (always "" when ``got`` is right to
    the tolerance: no relation is said of a right answer). Never says the expected value."""
    want = np.asarray(want, dtype=np.float64)
    if got is not None:
        try:
            got = np.asarray(got)
        except (ValueError, TypeError):  # a ragged list: no array to relate
            return ""
        if not np.issubdtype(got.dtype, np.number) or np.iscomplexobj(got) or got.size > MAX_GROWTH * want.size + 64:
            return ""  # not numbers, or far larger than the right one: no relation worth the search
        got = got.astype(np.float64)
        if got.shape == want.shape:
            same_inf = np.isinf(got) & (got == want)  # −inf where −inf is right (a blocked score): equal, as 0 and 0
            got, want = np.where(same_inf, 0.0, got), np.where(same_inf, 0.0, want)
            if _close(got, want, scale):
                return ""
    said = missing(got, want, scale)
    if said is None and got is not None:
        finders = (
            lambda: constant_factor(got, want, scale, names),
            lambda: swapped_axes(got, want, scale),
            lambda: reordered(got, want, scale),
            lambda: scrambled(got, want, scale),
            lambda: summed_wrong(got, want, scale),
            lambda: wrong_axis(got, want, scale, axes),
            lambda: transposed_weight(got, want, scale, weights),
            lambda: known_variant(got, want, scale, variants),
            lambda: missing_path(got, want, scale, paths, names),
            lambda: wrong_on_part(got, want, scale, masked_rows, parts),
            lambda: elementwise_factor(got, want, scale, arrays),
            lambda: varying_factor(got, want, scale),
        )
        with np.errstate(all="ignore"):
            said = next((s for s in map(_safely, finders) if s), None)
    return f"{gradient} ({where}) {said}." if said else ""
