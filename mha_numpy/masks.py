"""Masks in mha_numpy's one convention, and converters at the edges.

Inside mha_numpy a mask is either
- boolean, ``True`` = this query **may attend** to this key, or
- floating, **added** to the scores (0 = keep, -inf = block; other values bias the scores),
with any shape that broadcasts to the scores (B, H, Lq, Lk), or
- a ``StructuredMask``: a bool mask given by its rule (causal with its alignment, a window, documents, a prefix,
  key padding) instead of its entries, O(Lq + Lk) memory; ``np.asarray`` builds the entries, and the chunked
  kernel classifies its tiles from the rule without them. The dense helpers take ``structured=True`` for it.

Other libraries use other conventions (table in ``docs/masks.md``); convert explicitly:

===================  ==========================  ==================================
library              boolean / 0-1 meaning        converters here
===================  ==========================  ==================================
torch MHA            True = **ignore**            from_torch_key_padding_mask, ...
torch SDPA           True = attend (same as us)   from_sdpa_mask / to_sdpa_mask
Hugging Face BERT    1 = keep, 0 = padding        padding_mask(attention_mask=...)
===================  ==========================  ==================================

Everything here is pure NumPy: torch tensors are not needed (pass ``tensor.numpy()``).
"""

from __future__ import annotations

import copy

import numpy as np

from ._checks import FLOAT_DTYPES, as_array, as_bool, as_int


def _is_bool(m: np.ndarray) -> bool:
    return m.dtype == np.bool_


def _our_mask(mask, name: str) -> np.ndarray:
    """``mask`` as an array of our convention (bool or floating); integer 0/1 masks are refused, not guessed."""
    m = as_array(mask, name)
    if not _is_bool(m) and not np.issubdtype(m.dtype, np.floating):
        raise ValueError(
            f"{name} must be bool (True = may attend) or floating (added to the scores), got dtype {m.dtype} with "
            f"shape {m.shape}: an integer 0/1 mask means 1 = keep in Hugging Face but would be a +1 bias here, so "
            "convert it explicitly (padding_mask(attention_mask=...), or mask.astype(bool) when 1 = may attend)"
        )
    return m


def padding_mask(lengths=None, max_len: int | None = None, *, attention_mask=None) -> np.ndarray:
    """Key padding mask (B, 1, 1, Lk), True = real token (may be attended to).

    Give either ``lengths`` (B,) of ints with optional ``max_len`` (default max(lengths)),
    or ``attention_mask`` (B, Lk), Hugging Face style: 1 = keep, 0 = padding.
    An empty batch is defined: ``padding_mask([])`` is (0, 1, 1, 0), ``padding_mask([], max_len=5)`` (0, 1, 1, 5).
    """
    if (lengths is None) == (attention_mask is None):
        raise ValueError("padding_mask needs exactly one of lengths=... or attention_mask=...")
    if attention_mask is not None:
        am = as_array(attention_mask, "attention_mask")
        if am.ndim != 2:
            raise ValueError(f"attention_mask must be (B, Lk), got shape {am.shape}")
        if am.dtype == object or not np.isin(am, (0, 1)).all():
            raise ValueError(f"attention_mask must hold only 0 and 1 (HF: 1 = keep), got {am.dtype} {am.shape}")
        return (am == 1)[:, None, None, :]  # (B, 1, 1, Lk)
    lengths = as_array(lengths, "lengths")
    if lengths.size == 0 and lengths.ndim == 1:  # B = 0: an empty batch, whatever dtype [] became
        lengths = lengths.astype(np.int64)
    if lengths.ndim != 1 or not np.issubdtype(lengths.dtype, np.integer):
        raise ValueError(
            f"lengths must be a 1-D integer array (B,), got dtype {lengths.dtype} shape {lengths.shape}; "
            "for a 0/1 (B, Lk) mask use padding_mask(attention_mask=...)"
        )
    max_len = int(lengths.max(initial=0)) if max_len is None else as_int(max_len, "max_len", minimum=0)
    if lengths.size and (lengths.min() < 0 or lengths.max() > max_len):
        raise ValueError(f"lengths {lengths.tolist()} must lie in [0, max_len={max_len}]")
    keep = np.arange(max_len)[None, :] < lengths[:, None]  # (B, Lk)
    return keep[:, None, None, :]  # (B, 1, 1, Lk)


ALIGNS = ("top-left", "bottom-right")


def _band_bounds(window: int | None, causal: bool) -> tuple[int | None, int | None]:
    """(lo, hi): the band lo <= p - j <= hi of a causal mask (0, None), a causal window (0, window - 1), a symmetric
    window (1 - window, window - 1) or neither (None, None); None: no bound on that side."""
    return (0 if causal else (None if window is None else 1 - window)), (None if window is None else window - 1)


def _band(p, j, lo, hi):
    """The one formula of every causal and window mask here (the dense ones, the mask_mods, ``StructuredMask``'s
    tiles): query position p may attend to key j when lo <= p - j <= hi (``_band_bounds``). p, j: integer arrays that
    broadcast (or torch tensors) -> bool of their broadcast shape, a fresh array."""
    if lo is None and hi is None:
        return (p - j) == (p - j)  # every entry, in the broadcast shape
    allowed = None if lo is None else j <= p - lo
    if hi is not None:
        allowed = j >= p - hi if allowed is None else allowed & (j >= p - hi)
    return allowed


def _positions(n: int, start: int = 0) -> np.ndarray:
    """(n,) start, start + 1, ...: int32 for the dense masks (their compares then run about twice as fast as int64's,
    measured: the speed of np.tri, which picks the smallest int; an (L, L) mask with L near 2³¹ could not be held)."""
    return np.arange(start, start + n, dtype=np.int32)


def _align_shift(align, Lq: int, Lk: int) -> int:
    """The position of query 0: 0 top-left (query i at position i), Lk - Lq bottom-right (the last query at the
    last key), or ValueError naming ``align``."""
    if not isinstance(align, str) or align not in ALIGNS:
        raise ValueError(f"align must be 'top-left' or 'bottom-right', got {align!r:.60}")
    return 0 if align == "top-left" else Lk - Lq


def causal_mask(
    Lq: int, Lk: int | None = None, diagonal: int = 0, align: str = "top-left", structured: bool = False
) -> np.ndarray:
    """(Lq, Lk) bool, True where key j <= p_i + diagonal, with p_i the position of query i.

    align="top-left" (the default): p_i = i, like ``torch.tril(ones(Lq, Lk), diagonal)``, SDPA's ``is_causal=True``
    and torch's ``causal_upper_left``. align="bottom-right": p_i = i + Lk - Lq, the last query sits at the last key,
    like torch's ``causal_lower_right`` and FlashAttention (since 2.1): Lq new queries after Lk - Lq cached keys
    (the KV cache, chunked prefill). With Lq > Lk its first Lq - Lk rows are fully masked.
    structured=True: the same mask as a ``StructuredMask`` (its rule, O(Lq + Lk) memory) instead of its entries.
    """
    Lq = as_int(Lq, "Lq", minimum=1)
    Lk = Lq if Lk is None else as_int(Lk, "Lk", minimum=1)
    diagonal = as_int(diagonal, "diagonal")  # any sign
    if as_bool(structured, "structured"):
        return StructuredMask(Lq, Lk, causal=True, offset=diagonal, align=align)
    k = min(max(diagonal + _align_shift(align, Lq, Lk), -Lq), Lk)  # beyond [-Lq, Lk] the mask no longer changes
    return _band(_positions(Lq, k)[:, None], _positions(Lk), 0, None)  # (Lq, Lk): j <= i + k


def sliding_window_mask(
    Lq: int, Lk: int, window: int, causal: bool = True, offset: int = 0, align: str = "top-left",
    structured: bool = False,
) -> np.ndarray:  # fmt: skip
    """(Lq, Lk) bool local-attention mask, True where query i may attend to key j.

    Query i sits at position p = i + offset, plus Lk - Lq with align="bottom-right" (as in ``causal_mask``;
    ``offset=Lk - Lq`` is the same). Then:
    - causal=True: the last ``window`` keys up to and including p, p - window < j <= p (Mistral's convention);
    - causal=False (symmetric): |p - j| < window, i.e. window - 1 keys on each side and p itself.
    ``window >= Lk`` with causal=True is ``causal_mask(Lq, Lk, diagonal=offset)``.
    Lq, Lk, window: positive ints; offset: an int of any sign; causal: a bool (ValueError otherwise: a float
    offset would put a query between two keys). structured=True: the same mask as a ``StructuredMask``.
    """
    Lq, Lk, window = as_int(Lq, "Lq", minimum=1), as_int(Lk, "Lk", minimum=1), as_int(window, "window", minimum=1)
    causal, offset = as_bool(causal, "causal"), as_int(offset, "offset")
    if as_bool(structured, "structured"):
        return StructuredMask(Lq, Lk, causal=causal, window=window, offset=offset, align=align)
    start = min(max(offset + _align_shift(align, Lq, Lk), -(Lq + window)), Lk + window)  # beyond: no entry changes
    return _band(_positions(Lq, start)[:, None], _positions(Lk), *_band_bounds(window, causal))  # (Lq, Lk)


def document_mask(lengths, causal: bool = False, L: int | None = None, structured: bool = False):
    """Packed sequences: (L, L) bool, or (B, 1, L, L) for one list of lengths per batch item, True where query i
    and key j lie in the same document (documents of ``lengths`` tokens, one after another from position 0) and,
    with causal=True, j <= i. L: default the documents' total (the largest one's, per batch item); positions past
    the documents belong to none: their rows are fully masked. structured=True: a ``StructuredMask`` instead."""
    total = max(int(n.sum()) for n in _per_item(lengths, "lengths")[0])
    m = StructuredMask(total if L is None else L, causal=as_bool(causal, "causal"), documents=lengths)
    return m if as_bool(structured, "structured") else _dense_2d(m)


def prefix_lm_mask(L: int, prefix, structured: bool = False):
    """Prefix-LM (T5's, UniLM's): (L, L) bool, True where key j is one of the first ``prefix`` keys (seen by every
    query: the prefix attends to itself bidirectionally) or j <= i (causal after it). prefix: an int, or one per
    batch item (B,) -> (B, 1, L, L). structured=True: a ``StructuredMask`` instead."""
    m = StructuredMask(L, causal=True, prefix=prefix)
    return m if as_bool(structured, "structured") else _dense_2d(m)


def chunked_causal_mask(
    Lq: int, Lk: int | None = None, chunk_size: int = 8192, left_padding=0, align: str = "top-left",
    structured: bool = False,
):  # fmt: skip
    """Chunked attention (Llama 4's "chunked_attention" layers): (Lq, Lk) bool, True where key j <= p_i lies in the
    same chunk of ``chunk_size`` positions as query i's position p_i, or (B, 1, Lq, Lk) with one ``left_padding``
    per batch item. The chunks are counted from each item's first real token, after ``left_padding`` pad tokens
    (transformers' ``create_chunked_causal_mask``: chunk (j - pad) // chunk_size); the pads' own rows and keys are
    left to the padding mask (``& padding_mask(...)``), as there.

    It is document masking, causal inside, with documents of chunk_size tokens (the first cut at left_padding):
    a ``StructuredMask`` with ``documents=`` (structured=True), whose tiles outside the chunks the chunked kernel
    skips. align="bottom-right": the Lq queries are the last of the Lk positions (decoding after a KV cache).
    A query past the last key would need a chunk the keys do not reach: ValueError naming Lq.
    """
    Lq = as_int(Lq, "Lq", minimum=1)
    Lk = Lq if Lk is None else as_int(Lk, "Lk", minimum=1)
    C = as_int(chunk_size, "chunk_size", minimum=1)
    if Lq > Lk and align == "top-left":
        raise ValueError(f"Lq={Lq} queries at positions 0 ... {Lq - 1} go past the Lk={Lk} keys: give Lk >= Lq")
    if np.ndim(left_padding) == 0:
        documents = _chunk_lengths(as_int(left_padding, "left_padding", minimum=0), C, Lk)  # shared by the batch
    else:
        pads = _per_item(left_padding, "left_padding")[0][0]  # (B,) non-negative ints
        if pads.size == 0:
            raise ValueError("left_padding must be an int or one int per batch item (B,), got an empty array")
        documents = [_chunk_lengths(int(p), C, Lk) for p in pads]  # one list of chunk lengths per batch item
    m = StructuredMask(Lq, Lk, causal=True, align=align, documents=documents)
    return m if as_bool(structured, "structured") else _dense_2d(m)


def _chunk_lengths(pad: int, C: int, Lk: int) -> np.ndarray:
    """The lengths of the chunks of positions 0 ... Lk - 1 cut at pad + m · C (every integer m): (n,) ints."""
    cuts = np.arange(pad % C, Lk, C)  # pad + m·C inside [0, Lk)
    bounds = np.unique(np.concatenate([[0], cuts, [Lk]]))
    return np.diff(bounds)


def _dense_2d(m: StructuredMask) -> np.ndarray:
    """The entries of ``m``: (Lq, Lk) when it is the same for every batch item, else (B, 1, Lq, Lk)."""
    dense = np.asarray(m)  # (b, 1, Lq, Lk)
    return dense[0, 0] if dense.shape[0] == 1 else dense


# --------------------------------------------------------------------------- mask_mods

# FlexAttention's form of a mask: a function ``mask_mod(b, h, q_idx, kv_idx) -> bool`` (True = may attend, as
# ours), here vectorised: b, h, q_idx, kv_idx are integer arrays that broadcast together (e.g. q_idx (n, 1) and
# kv_idx (1, m) for one tile) and the result is a bool array of their broadcast shape. ``block_mask.
# create_block_mask`` turns one into a ``BlockMask``. Those written with operators alone (causal_mod, window_mod,
# prefix_lm_mod with an int prefix) run unchanged on torch tensors.


def causal_mod(b, h, q_idx, kv_idx):
    """The mask_mod of ``causal_mask(Lq, Lk)`` (top-left: query i at position i): key j <= i."""
    return _band(q_idx, kv_idx, 0, None)


def window_mod(window: int | None = None, causal: bool = True, offset: int = 0):
    """The mask_mod of ``sliding_window_mask(Lq, Lk, window, causal, offset)``: query i at position p = i + offset,
    p - window < j <= p (causal) or |p - j| < window. window=None: no window, so causal=True is ``causal_mask(Lq, Lk,
    diagonal=offset)``. The bottom-right alignment (the last query at the last key) is offset = Lk - Lq."""
    window = None if window is None else as_int(window, "window", minimum=1)
    causal, offset = as_bool(causal, "causal"), as_int(offset, "offset")
    lo, hi = _band_bounds(window, causal)

    def window_mask(b, h, q_idx, kv_idx):
        return _band(q_idx + offset, kv_idx, lo, hi)  # query i at position p_i = i + offset

    return window_mask


def document_mod(lengths):
    """The mask_mod of ``document_mask(lengths)``: query i and key j lie in the same document (documents of
    ``lengths`` tokens (1-D, shared by the batch) packed from position 0); a position past them belongs to none.
    Causal within the documents: ``block_mask.and_masks(document_mod(lengths), causal_mod)``."""
    items, shared = _per_item(lengths, "lengths")
    if not shared:
        raise ValueError(f"lengths must be 1-D (one list shared by the batch), got shape {np.shape(lengths)}")
    ends = np.cumsum(items[0])  # (n_docs,) one past each document's last position

    def document(b, h, q_idx, kv_idx):
        return _same_document(_document_of(ends, q_idx), _document_of(ends, kv_idx))

    return document


def prefix_lm_mod(prefix):
    """The mask_mod of ``prefix_lm_mask(L, prefix)``: key j is one of the first ``prefix`` keys, or j <= i.
    prefix: an int, or one per batch item (B,) (then indexed by b)."""
    if np.ndim(prefix) == 0:
        P = as_int(prefix, "prefix", minimum=0)
    else:
        P = _per_item(prefix, "prefix")[0][0]  # (B,) non-negative ints

    def prefix_lm(b, h, q_idx, kv_idx):
        return (kv_idx < (P if isinstance(P, int) else P[b])) | _band(q_idx, kv_idx, 0, None)

    return prefix_lm


def chunked_causal_mod(chunk_size: int, left_padding=0):
    """The mask_mod of ``chunked_causal_mask(Lq, Lk, chunk_size, left_padding)`` (top-left): key j <= i in query
    i's chunk, (j - pad) // chunk_size == (i - pad) // chunk_size, transformers' ``chunked_causal_mask_function``.
    left_padding: an int, or one per batch item (B,) (then indexed by b)."""
    C = as_int(chunk_size, "chunk_size", minimum=1)
    pad = as_int(left_padding, "left_padding", minimum=0) if np.ndim(left_padding) == 0 else None
    pads = None if pad is not None else _per_item(left_padding, "left_padding")[0][0]  # (B,) non-negative ints

    def chunked_causal(b, h, q_idx, kv_idx):
        p = pad if pads is None else pads[b]
        return ((kv_idx - p) // C == (q_idx - p) // C) & (kv_idx <= q_idx)

    return chunked_causal


# --------------------------------------------------------------------------- structured masks

# The state of a rectangle of a mask: nothing allowed / everything allowed / perhaps both (its entries tell) /
# certainly both (a band's edge, padding: no entry need be looked at to know it)
EMPTY, FULL, PARTIAL, MIXED = 0, 1, 2, 3
BAND_TILES, BAND_TILE_BYTES = 32, 2**18  # a StructuredMask keeps up to 32 band tiles of <= 256 KiB (_entries)


def _and(a: int, b: int) -> int:
    """The state of a rectangle allowed by two rules at once."""
    if EMPTY in (a, b):
        return EMPTY
    return b if a == FULL else (a if b == FULL else PARTIAL)  # two mixed rules may leave nothing: perhaps


def _or(a: int, b: int) -> int:
    """The state of a rectangle allowed by either of two rules."""
    if FULL in (a, b):
        return FULL
    return b if a == EMPTY else (a if b == EMPTY else PARTIAL)  # two mixed rules may leave everything: perhaps


def _count_state(cum: np.ndarray, j0: int, j1: int) -> int:
    """How many of the keys j0 ... j1 - 1 a flag allows, from its cumulative count ``cum`` (Lk + 1,)."""
    n = int(cum[j1] - cum[j0])
    return FULL if n == j1 - j0 else (EMPTY if n == 0 else MIXED)


def _per_item(x, name: str) -> tuple[list[np.ndarray], bool]:
    """Document lengths (or one value per document) -> (one 1-D int array per batch item, shared): a 1-D array is
    one list shared by every item (shared = True); a 2-D array or a list of 1-D arrays of any lengths, one per item."""
    if isinstance(x, (list, tuple)) and x and all(np.ndim(a) == 1 for a in x):
        items, shared = [as_array(a, f"{name}[{i}]") for i, a in enumerate(x)], False
    else:
        a = as_array(x, name)
        if a.ndim not in (1, 2):
            raise ValueError(f"{name} must be 1-D (shared by the batch) or one 1-D list per batch item, got {a.shape}")
        items, shared = ([a], True) if a.ndim == 1 else (list(a), False)
    for i, a in enumerate(items):
        a = a.astype(np.int64) if a.size == 0 else a  # [] is float64 to NumPy
        if not np.issubdtype(a.dtype, np.integer) or (a.size and a.min() < 0):
            raise ValueError(f"{name} must hold non-negative ints, got {a.dtype} {a.tolist()!r:.80}")
        items[i] = a.astype(np.int64)
    return items, shared


def _document_of(ends: np.ndarray, pos) -> np.ndarray:
    """The document of each position, documents packed from position 0 (``ends``: (n_docs,) one past each one's last
    position): its index, or -1 for a position before or past them all (it belongs to none)."""
    pos = np.asarray(pos)
    total = int(ends[-1]) if ends.size else 0
    return np.where((pos >= 0) & (pos < total), np.searchsorted(ends, pos, side="right"), -1)


def _same_document(q_doc, kv_doc) -> np.ndarray:
    """The one formula of every document mask here (``document_mod``, ``StructuredMask``'s tiles): query and key lie
    in the same document (``_document_of``; a query in none sees no key)."""
    return (q_doc == kv_doc) & (q_doc >= 0)


def _documents(n: np.ndarray, pos: np.ndarray, Lk: int, name: str):
    """Documents of lengths n (n_docs,), packed from position 0 -> per query position p (Lq,), its document
    (``_document_of``) and the keys [lo, hi) of it (an empty range before or after every document), and per key j
    (Lk,), its document and that one's first position (Lk for a key past the documents)."""
    n = n if n.size else np.zeros(1, np.int64)  # no document: one of length 0
    ends = np.cumsum(n)  # (n_docs,) one past each document's last position
    first, total = ends - n, int(ends[-1])
    if total > Lk:
        raise ValueError(f"{name} covers {total} positions, more than the Lk = {Lk} keys")
    d = _document_of(ends, pos)  # (Lq,) p's document, -1 for none
    outside = np.where(pos < 0, 0, total)  # (Lq,) an empty range at the start or at the end
    lo, hi = np.where(d >= 0, first[d], outside), np.where(d >= 0, ends[d], outside)  # (Lq,) each
    dj = _document_of(ends, np.arange(Lk))  # (Lk,) key j's document, -1 past them
    return d, lo, hi, dj, np.where(dj >= 0, first[dj], Lk)


class StructuredMask:
    """A bool mask (b, 1, Lq, Lk) given by its rule instead of its entries: O(Lq + Lk) memory, not Lq · Lk.

    Query i sits at position p_i = i + offset (plus Lk - Lq with align="bottom-right", as in ``causal_mask``), key j
    at position j. Query i may attend to key j when all of these hold:

    - ``documents`` (lengths of documents packed one after another from position 0: one list shared by the batch,
      or one per batch item): p_i and j lie in the same document. A position past the last document belongs to
      none, so its row is fully masked (zero weights, zero context).
    - ``keys`` (B, Lk) or (B, 1, 1, Lk) bool, a key padding mask (``padding_mask``): key j is real.
    - j is one of the first ``prefix`` keys of its document (an int, or one per document; without documents the
      sequence is the document, and prefix may be one per batch item (B,)): prefix-LM. Or else:
      ``causal``: j <= p_i, and ``window``: p_i - j < window (causal) or |p_i - j| < window (causal=False), the
      rules of ``sliding_window_mask``.

    It is a mask like any other: ``np.asarray(mask)`` gives its entries and ``mask.shape`` their shape, so
    ``functional``, the vectorized and the naive kernels (which hold the whole score tensor) build them. The
    chunked kernel never does: ``classify`` gives the state of a tile from the rule (``EMPTY``: skipped, ``FULL``:
    computed without a mask, ``MIXED``: certainly both, ``PARTIAL``: perhaps both, the entries tell), ``tile``
    builds the entries of a tile with both, and ``key_range`` / ``query_range`` bound the tiles it visits at all.
    ``mask & padding_mask(...)`` and ``mask & other`` (another StructuredMask of the same Lq, Lk) keep the
    structure, and so does ``combine_masks``; ``append_keys(n)`` is the mask with n more keys every query may
    attend to (torch's ``add_bias_kv``).
    """

    __array_ufunc__ = None  # ``array & mask`` comes to __rand__ (keeps the structure) instead of building entries
    dtype = np.dtype(bool)
    ndim = 4

    def __init__(
        self, Lq: int, Lk: int | None = None, *, causal: bool = False, window: int | None = None, offset: int = 0,
        align: str = "top-left", documents=None, prefix=0, keys=None,
    ) -> None:  # fmt: skip
        self.Lq = as_int(Lq, "Lq", minimum=0)
        self.Lk = self.Lq if Lk is None else as_int(Lk, "Lk", minimum=0)  # the sequence's keys, not appended ones
        Lq, Lk = self.Lq, self.Lk
        self.causal, self.align = as_bool(causal, "causal"), align
        self.window = None if window is None else as_int(window, "window", minimum=1)
        self.offset = as_int(offset, "offset")
        self.appended, self._also = 0, ()  # keys appended after the sequence's (all allowed); masks ANDed with this
        w, start = self.window, self.offset + _align_shift(align, Lq, Lk)  # start: the position of query 0
        start = min(max(start, -(Lq + (w or 0) + 1)), Lk + (w or 0) + 1)  # beyond these no entry changes
        self._pos = np.arange(Lq, dtype=np.int64) + start  # (Lq,) p_i
        # the band lo <= p_i - j <= hi (None: no bound on that side)
        self._lo, self._hi = (0 if self.causal else (None if w is None else 1 - w)), (None if w is None else w - 1)
        sizes = {}  # the batch size each argument implies (1: shared by the batch)
        self._qlo = self._qhi = self._qdoc = self._kdoc = self._free = self._keys = None
        docs = None
        if documents is not None:
            lengths, shared = _per_item(documents, "documents")
            sizes["documents"] = 1 if shared else len(lengths)
            docs = [(*_documents(n, self._pos, Lk, f"documents[{b}]"), n.size) for b, n in enumerate(lengths)]
            self._qdoc, self._kdoc = np.stack([d[0] for d in docs]), np.stack([d[3] for d in docs])  # (b, Lq), (b, Lk)
            self._qlo = np.stack([d[1] for d in docs])  # (b, Lq) the keys of p_i's document start here ...
            self._qhi = np.stack([d[2] for d in docs])  # (b, Lq) ... and end here; both non-decreasing along Lq
        if self._lo is not None or self._hi is not None:  # without a band every key is allowed: no prefix needed
            self._free = self._prefix(prefix, docs, sizes)  # (b, Lk) bool or None
        if keys is not None:
            k = as_array(keys, "keys")
            k = k[:, 0, 0] if k.ndim == 4 and k.shape[1:3] == (1, 1) else k  # padding_mask's (B, 1, 1, Lk)
            if k.dtype != np.bool_ or k.ndim != 2 or k.shape[1] != Lk:
                raise ValueError(f"keys must be a bool key padding mask (B, Lk) or (B, 1, 1, Lk) with Lk = {Lk}, "
                                 f"got {k.dtype} {k.shape}")  # fmt: skip
            self._keys, sizes["keys"] = k, k.shape[0]
        self.batch = self._batch(sizes)
        self._free_cum, self._keys_cum = _cumulative(self._free), _cumulative(self._keys)  # (b, Lk + 1) each
        self._band_tiles = {}  # (p_i0 - j0, rows, columns) -> a band's tile, read-only (``_entries``)

    @staticmethod
    def _batch(sizes: dict) -> int:
        """The one batch size the arguments imply (1 when all are shared), or ValueError naming them."""
        distinct = {n for n in sizes.values() if n != 1}
        if len(distinct) > 1:
            raise ValueError(f"batch sizes differ: {', '.join(f'{name} {n}' for name, n in sizes.items())}")
        return distinct.pop() if distinct else 1

    def _prefix(self, prefix, docs, sizes) -> np.ndarray | None:
        """(b, Lk) bool: the keys among the first ``prefix`` of their document (None: no prefix)."""
        j = np.arange(self.Lk)
        if not isinstance(prefix, (list, tuple)) and np.ndim(prefix) == 0:  # np.ndim of a ragged list raises
            P = as_int(prefix, "prefix", minimum=0)
            if P == 0:
                return None
            if docs is None:
                return (j < P)[None]  # (1, Lk)
            return np.stack([(first < self.Lk) & (j - first < P) for *_, first, _ in docs])  # (b, Lk)
        values, shared = _per_item(prefix, "prefix")
        if docs is None:  # one per batch item, each item one document
            if not shared:
                raise ValueError(f"prefix without documents is an int or one per item (B,), got {np.shape(prefix)}")
            sizes["prefix"] = values[0].size
            return j[None, :] < values[0][:, None]  # (B, Lk)
        sizes["prefix"] = 1 if shared else len(values)
        n = max(len(values), len(docs))
        if len(values) not in (1, n) or len(docs) not in (1, n):
            raise ValueError(f"prefix has {len(values)} batch items and documents {len(docs)}")
        out = []
        for b in range(n):
            v, (*_, dj, first, n_docs) = values[b if len(values) > 1 else 0], docs[b if len(docs) > 1 else 0]
            if v.size != n_docs:
                raise ValueError(f"prefix must hold one value per document: {n_docs} for batch item {b}, got {v.size}")
            v = v if v.size else np.zeros(1, np.int64)  # no document: no key either
            out.append((first < self.Lk) & (j - first < v[dj]))  # (Lk,): a key past the documents has first = Lk
        return np.stack(out)  # (b, Lk)

    # ------------------------------------------------------------------ a mask like any other

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """(b, 1, Lq, Lk): b = 1 or B, Lk counting appended keys; it broadcasts to the scores (B, H, Lq, Lk)."""
        return (self.batch, 1, self.Lq, self.Lk + self.appended)

    @property
    def nbytes(self) -> int:
        """The bytes of the rule's own arrays (its entries would take b · Lq · Lk); not the band tiles it keeps
        once a kernel asked for them (at most BAND_TILES · BAND_TILE_BYTES, ``_entries``)."""
        arrays = (self._pos, self._qlo, self._qhi, self._qdoc, self._kdoc, self._free, self._keys, self._free_cum,
                  self._keys_cum)  # fmt: skip
        return sum(a.nbytes for a in arrays if a is not None) + sum(m.nbytes for m in self._also)

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        """The entries, (b, 1, Lq, Lk) bool: built now (b · Lq · Lk bytes)."""
        if copy is False:
            raise ValueError("a StructuredMask holds no entries to view: np.asarray builds them")
        out, band = np.empty(self.shape, dtype=bool), max(1, 2**22 // max(1, self.shape[3]))  # rows of ~4 MiB
        for b in range(self.batch):
            for i0 in range(0, self.Lq, band):  # band by band: no temporary of the whole (Lq, Lk)
                out[b, 0, i0 : i0 + band] = self.tile(b, i0, min(i0 + band, self.Lq), 0, self.shape[3])
        return out if dtype is None else out.astype(dtype)

    def __repr__(self) -> str:
        shown = dict(causal=self.causal, window=self.window, offset=self.offset, align=self.align,
                     documents=self._qlo is not None, prefix=self._free is not None, keys=self._keys is not None,
                     appended=self.appended, also=len(self._also))  # fmt: skip
        parts = [f"{k}={v!r}" for k, v in shown.items() if v not in (False, None, 0, "top-left")]
        return f"StructuredMask(Lq={self.Lq}, Lk={self.Lk}{''.join(', ' + p for p in parts)})"

    def append_keys(self, n: int) -> StructuredMask:
        """This mask with n more keys after its Lk, which every query may attend to (torch's add_bias_kv)."""
        out = copy.copy(self)
        out.appended = self.appended + as_int(n, "n", minimum=0)
        return out

    def __and__(self, other) -> StructuredMask:
        """Allowed where both allow: ``other`` is a StructuredMask of the same (Lq, Lk) or a bool key padding mask
        (B, 1, 1, Lk) or (Lk,); anything else is a ValueError (``combine_masks`` builds the entries then)."""
        if not isinstance(other, StructuredMask):
            m = as_array(other, "mask")
            if not _is_key_padding(m, self.Lk):
                raise ValueError(
                    f"a StructuredMask combines with another one or with a bool key padding mask (B, 1, 1, "
                    f"Lk={self.Lk}), got {m.dtype} {m.shape}; combine_masks(...) builds the entries for other masks"
                )
            other = StructuredMask(self.Lq, self.Lk, keys=m.reshape(-1, self.Lk))
        if (other.Lq, other.Lk) != (self.Lq, self.Lk) or self.appended or other.appended:
            raise ValueError(f"StructuredMasks of shapes {self.shape} and {other.shape} do not combine")
        out = copy.copy(self)
        out._also, out.batch = (*self._also, other), self._batch({"mask": self.batch, "other": other.batch})
        return out

    __rand__ = __and__

    def as_mask_mod(self):
        """This rule as a FlexAttention mask_mod (``block_mask``): ``mod(b, h, q_idx, kv_idx)`` -> bool, the index
        arrays broadcasting together; built from the ``tile`` of the rectangle the indices span (a tile's own
        indices: that tile), so a long sequence costs what the rectangles asked for, not Lq × Lk."""

        def structured(b, h, q_idx, kv_idx):
            q, kv = np.asarray(q_idx), np.asarray(kv_idx)
            b = np.asarray(b) if self.batch > 1 else np.zeros((), np.int64)  # a rule shared by the batch: item 0's
            shape = np.broadcast_shapes(b.shape, np.shape(h), q.shape, kv.shape)
            if q.size == 0 or kv.size == 0:
                return np.zeros(shape, dtype=bool)
            q0, k0 = int(q.min()), int(kv.min())
            out = np.empty(shape, dtype=bool)
            for item in np.unique(b):  # one rectangle per batch item asked for
                t = self.tile(int(item), q0, int(q.max()) + 1, k0, int(kv.max()) + 1)  # (n, m)
                np.copyto(out, np.broadcast_to(t[q - q0, kv - k0], shape), where=np.broadcast_to(b == item, shape))
            return out

        return structured

    # ------------------------------------------------------------------ what the tiles ask

    def head(self, h: int) -> StructuredMask:
        """The mask of head h, whose tiles a kernel asks about: this one (its heads share it). A mask that differs
        per head (``block_mask.BlockMask``) returns its head's."""
        return self

    def classify(self, b: int, i0: int, i1: int, j0: int, j1: int) -> int:
        """The state of the rectangle of queries i0 ... i1 - 1 and keys j0 ... j1 - 1 (both non-empty) of batch
        item b, from the rule alone (O(1), no entry built): ``EMPTY`` (nothing allowed), ``FULL`` (everything),
        ``MIXED`` (certainly both) or ``PARTIAL`` (perhaps both: the entries tell, e.g. at a document boundary).
        All but PARTIAL are exact."""
        if j1 <= self.Lk:
            return self._state(b, i0, i1, j0, j1)
        if j0 >= self.Lk:
            return FULL  # appended keys only
        state = self._state(b, i0, i1, j0, self.Lk)  # and appended keys, all allowed
        return state if state in (FULL, PARTIAL) else MIXED

    def tile(self, b: int, i0: int, i1: int, j0: int, j1: int) -> np.ndarray:
        """(i1 - i0, j1 - j0) bool: the entries of one rectangle of batch item b, built from the rule (read-only when
        a band's tile is kept for the next call: ``_entries``)."""
        if j1 <= self.Lk:
            return self._entries(b, i0, i1, j0, j1)
        out = np.ones((i1 - i0, j1 - j0), dtype=bool)  # appended keys: allowed
        if j0 < self.Lk:
            out[:, : self.Lk - j0] = self._entries(b, i0, i1, j0, self.Lk)
        return out

    def key_range(self, b: int, i0: int, i1: int) -> tuple[int, int]:
        """(j_lo, j_hi): the queries i0 ... i1 - 1 (non-empty) of batch item b may attend to no key of the sequence
        outside j_lo ... j_hi - 1 (a bound; inside, ``classify`` tells), 0 <= j_lo <= j_hi <= Lk, j_lo = j_hi when
        they see none. Appended keys are allowed to every query."""
        lo, hi = 0, self.Lk
        if self._hi is not None:
            lo = max(lo, int(self._pos[i0]) - self._hi)  # j >= p_i - hi
        if self._lo is not None:
            hi = min(hi, int(self._pos[i1 - 1]) - self._lo + 1)  # j <= p_i - lo
        if self._free is not None:  # the prefix keys, whatever the band says: the span of both
            f_lo, f_hi = _span(_item(self._free_cum, b))
            lo, hi = (min(lo, f_lo), max(hi, f_hi)) if lo < hi else (f_lo, f_hi)
        if self._qlo is not None:  # p_i's documents: non-decreasing along the queries
            lo, hi = max(lo, int(_item(self._qlo, b)[i0])), min(hi, int(_item(self._qhi, b)[i1 - 1]))
        if self._keys is not None:
            k_lo, k_hi = _span(_item(self._keys_cum, b))
            lo, hi = max(lo, k_lo), min(hi, k_hi)
        for m in self._also:
            m_lo, m_hi = m.key_range(b, i0, i1)
            lo, hi = max(lo, m_lo), min(hi, m_hi)
        lo = min(lo, self.Lk)  # a band past the last key (p_i0 - hi > Lk) allows none: an empty range inside [0, Lk]
        return lo, max(lo, hi)

    def query_range(self, b: int, j0: int, j1: int) -> tuple[int, int]:
        """(i_lo, i_hi): no query outside i_lo ... i_hi - 1 of batch item b may attend to a key j0 ... j1 - 1
        (non-empty; a bound, as ``key_range``), 0 <= i_lo <= i_hi <= Lq, i_lo = i_hi when none does. An appended key
        is allowed to every query."""
        if j1 > self.Lk:
            return 0, self.Lq
        lo, hi, base = 0, self.Lq, int(self._pos[0]) if self.Lq else 0  # p_i = i + base
        if self._lo is not None:
            lo = max(lo, j0 + self._lo - base)  # p_i >= j + lo for some key j
        if self._hi is not None:
            hi = min(hi, j1 - 1 + self._hi - base + 1)  # p_i <= j + hi
        if self._free is not None and _count_state(_item(self._free_cum, b), j0, j1) != EMPTY:
            lo, hi = 0, self.Lq  # a prefix key: every query (of its document) sees it
        if self._qlo is not None:  # the queries whose document holds a key here
            lo = max(lo, int(np.searchsorted(_item(self._qhi, b), j0, side="right")))  # qhi > j0
            hi = min(hi, int(np.searchsorted(_item(self._qlo, b), j1, side="left")))  # qlo < j1
        if self._keys is not None and _count_state(_item(self._keys_cum, b), j0, j1) == EMPTY:
            return 0, 0  # only padding here
        for m in self._also:
            m_lo, m_hi = m.query_range(b, j0, j1)
            lo, hi = max(lo, m_lo), min(hi, m_hi)
        lo = min(lo, self.Lq)  # keys past every query's band (a negative diagonal): an empty range inside [0, Lq]
        return lo, max(lo, hi)

    def key_tiles(self, b: int, i0: int, i1: int, bk: int) -> list[int]:
        """The first keys j0 (multiples of bk) of the tiles of bk keys that may hold an allowed key for the queries
        i0 ... i1 - 1 of batch item b: those of ``key_range``, and of the appended keys (allowed to every query)."""
        lo, hi = self.key_range(b, i0, i1)
        seen = range(lo // bk * bk, hi, bk) if lo < hi else ()  # no key of the sequence: no tile of it
        appended = range(self.Lk // bk * bk, self.Lk + self.appended, bk) if self.appended else ()
        return sorted(set(seen) | set(appended))

    def query_tiles(self, b: int, j0: int, j1: int, bq: int) -> list[int]:
        """The first queries i0 (multiples of bq) of the tiles of bq queries that may attend to a key j0 ... j1 - 1
        (``query_range``): none when no query does."""
        lo, hi = self.query_range(b, j0, j1)
        return list(range(lo // bq * bq, hi, bq)) if lo < hi else []

    def _state(self, b: int, i0: int, i1: int, j0: int, j1: int) -> int:
        """``classify`` on the sequence's keys (j1 <= Lk)."""
        state = FULL
        if self._lo is not None or self._hi is not None:
            d_min, d_max = int(self._pos[i0]) - (j1 - 1), int(self._pos[i1 - 1]) - j0  # p_i - j over the rectangle
            lo, hi = self._lo, self._hi
            if (lo is not None and d_max < lo) or (hi is not None and d_min > hi):
                state = EMPTY  # every p_i - j out of the band (each value between d_min and d_max occurs)
            elif (lo is None or d_min >= lo) and (hi is None or d_max <= hi):
                state = FULL
            else:
                state = MIXED  # some of the values are in the band, some out
            if self._free is not None:
                state = _or(state, _count_state(_item(self._free_cum, b), j0, j1))
        if self._qlo is not None:
            qlo, qhi = _item(self._qlo, b), _item(self._qhi, b)  # (Lq,) each, non-decreasing
            if qhi[i1 - 1] <= j0 or qlo[i0] >= j1:
                state = EMPTY  # every query's document ends before j0, or starts after j1
            elif not (qlo[i1 - 1] <= j0 and j1 <= qhi[i0]):  # not: every query's document holds every key here
                state = _and(state, PARTIAL)
        if self._keys is not None:
            state = _and(state, _count_state(_item(self._keys_cum, b), j0, j1))
        for m in self._also:
            if state == EMPTY:
                break
            state = _and(state, m._state(b, i0, i1, j0, j1))
        return state

    def _entries(self, b: int, i0: int, i1: int, j0: int, j1: int) -> np.ndarray:
        """``tile`` on the sequence's keys (j1 <= Lk): (i1 - i0, j1 - j0) bool.

        A band alone (causal, window: no documents, prefix, keys or other mask) allows (i, j) by p_i - j, and
        p_i = p_i0 + (i - i0): its tile depends only on p_i0 - j0 and the tile's shape, and a kernel meets few of
        them (the diagonal, the window's edge, their quarters), each many times. Those are built once and kept,
        read-only: up to BAND_TILES of at most BAND_TILE_BYTES each (8 MiB; 512 × 512 tiles fit). Measured
        (benchmarks/bench_masks.py): without this the chunked kernel took ~10% longer with the rule than with the
        dense mask at L = 16384, window 1024; with it ~10% less."""
        band = self._qlo is None and self._free is None and self._keys is None and not self._also
        if band and (t := self._band_tiles.get(key := (int(self._pos[i0]) - j0, i1 - i0, j1 - j0))) is not None:
            return t
        j, p = np.arange(j0, j1), self._pos[i0:i1, None]  # (m,), (n, 1)
        no_band = self._lo is None and self._hi is None
        t = np.ones((i1 - i0, j1 - j0), dtype=bool) if no_band else _band(p, j, self._lo, self._hi)  # (n, m)
        if self._free is not None:
            t |= _item(self._free, b)[j0:j1]  # a prefix key, whatever the band says
        if self._qdoc is not None:
            t &= _same_document(_item(self._qdoc, b)[i0:i1, None], _item(self._kdoc, b)[j0:j1])  # (n, m)
        if self._keys is not None:
            t &= _item(self._keys, b)[j0:j1]
        for m in self._also:
            t &= m._entries(b, i0, i1, j0, j1)
        if band and t.nbytes <= BAND_TILE_BYTES and len(self._band_tiles) < BAND_TILES:
            t.flags.writeable = False  # shared by every caller: the kernel only reads it
            self._band_tiles[key] = t  # one dict item set: thread-safe
        return t


def _item(a: np.ndarray, b: int) -> np.ndarray:
    """Row b of an array (b, ...) of a mask's rule, or its only row when the batch shares it."""
    return a[b if a.shape[0] > 1 else 0]


def _cumulative(flags: np.ndarray | None) -> np.ndarray | None:
    """(b, Lk) bool -> (b, Lk + 1) counts: how many of keys 0 ... j - 1 are flagged, for O(1) range counts."""
    if flags is None:
        return None
    return np.concatenate([np.zeros((flags.shape[0], 1), np.int64), np.cumsum(flags, axis=1)], axis=1)


def _span(cum: np.ndarray) -> tuple[int, int]:
    """(first flagged key, last flagged key + 1) from the counts (Lk + 1,); an empty span when none is."""
    total = int(cum[-1])
    if total == 0:
        return len(cum) - 1, 0
    return int(np.searchsorted(cum, 1)) - 1, int(np.searchsorted(cum, total))


def _is_key_padding(m: np.ndarray, Lk: int) -> bool:
    """A bool mask that varies over the batch and the keys only: (Lk,) or (b, 1, 1, Lk)."""
    return m.dtype == np.bool_ and (m.shape == (Lk,) or (m.ndim == 4 and m.shape[1:] == (1, 1, Lk)))


def _float_dtype(dtype, allowed=FLOAT_DTYPES) -> np.dtype:
    """``dtype`` (a dtype, a type or a name such as "float32") as one of ``allowed``, or ValueError naming it."""
    dt = None
    if isinstance(dtype, (type, np.dtype, str)):
        try:
            dt = np.dtype(dtype)
        except TypeError:
            pass
    if dt is None or dt not in allowed:
        raise ValueError(f"dtype must be one of {', '.join(map(str, allowed))}, got {dtype!r:.60}")
    return dt


def to_additive(mask: np.ndarray, dtype=np.float64) -> np.ndarray:
    """Boolean mask (True = may attend) -> float mask (0 where allowed, -inf where blocked); floats are cast.

    Integer masks raise ValueError (see ``combine_masks``).
    """
    mask, dtype = _our_mask(mask, "mask"), _float_dtype(dtype)
    if not _is_bool(mask):
        return mask.astype(dtype, copy=False)
    return np.where(mask, 0.0, -np.inf).astype(dtype)


def combine_masks(*masks) -> np.ndarray | None:
    """Combine masks of our convention; ``None`` entries are ignored.

    All boolean -> logical AND (may attend only where every mask allows). Any floating ->
    the booleans become 0/-inf and everything is summed. Shapes broadcast together.
    A ``StructuredMask`` stays one when the others are StructuredMasks or bool key padding masks (B, 1, 1, Lk);
    with any other mask its entries are built. Integer masks are refused with a ValueError naming ``masks[i]``:
    a 0/1 mask is "1 = keep" in Hugging Face,
    and adding it would make a +1 bias (or, turned into an int -inf, INT64_MIN); convert it explicitly first.
    """
    if any(isinstance(m, StructuredMask) for m in masks):
        return _combine_structured(masks)
    present = [_our_mask(m, f"masks[{i}]") for i, m in enumerate(masks) if m is not None]
    if not present:
        return None
    try:
        np.broadcast_shapes(*[m.shape for m in present])
    except ValueError:
        raise ValueError(f"masks with shapes {[m.shape for m in present]} do not broadcast together") from None
    if all(_is_bool(m) for m in present):
        out = present[0]
        for m in present[1:]:
            out = out & m
        return out
    dtype = np.result_type(*[m.dtype for m in present if not _is_bool(m)])
    out = to_additive(present[0], dtype)
    with np.errstate(over="ignore"):  # finfo.min + finfo.min = -inf: blocked either way
        for m in present[1:]:
            out = out + to_additive(m, dtype)
    return out


def _combine_structured(masks) -> StructuredMask | np.ndarray:
    """``combine_masks`` with a StructuredMask among ``masks``: still one (ANDed) while the others are
    StructuredMasks or bool key paddings; otherwise the structured ones' entries are built and combined as arrays."""
    structured = [m for m in masks if isinstance(m, StructuredMask)]
    arrays = [(i, m) for i, m in enumerate(masks) if m is not None and not isinstance(m, StructuredMask)]
    rest = [_our_mask(m, f"masks[{i}]") for i, m in arrays]
    out = structured[0]
    for m in structured[1:]:
        out = out & m
    if all(_is_key_padding(m, out.Lk) and not out.appended for m in rest):
        for m in rest:
            out = out & m
        return out
    return combine_masks(np.asarray(out), *rest)


# --------------------------------------------------------------------------- torch MHA


def from_torch_key_padding_mask(key_padding_mask) -> np.ndarray:
    """torch MHA ``key_padding_mask`` (B, Lk) -> ours (B, 1, 1, Lk).

    torch: bool True = **ignore** this key; float = added. Ours: bool True = may attend.
    """
    kpm = _our_mask(key_padding_mask, "key_padding_mask")  # torch refuses integer masks too
    if kpm.ndim != 2:
        raise ValueError(f"key_padding_mask must be (B, Lk), got shape {kpm.shape}")
    converted = ~kpm if _is_bool(kpm) else kpm
    return converted[:, None, None, :]


def to_torch_key_padding_mask(mask) -> np.ndarray:
    """Our key padding mask (B, 1, 1, Lk) or (B, Lk) -> torch MHA's (B, Lk) (bool True = ignore)."""
    m = _our_mask(mask, "mask")  # an integer mask would be bit-inverted by ~
    if m.ndim == 4:
        if m.shape[1:3] != (1, 1):
            raise ValueError(f"a key padding mask must be (B, 1, 1, Lk), got shape {m.shape}")
        m = m[:, 0, 0, :]
    if m.ndim != 2:
        raise ValueError(f"mask must be (B, 1, 1, Lk) or (B, Lk), got shape {m.shape}")
    return ~m if _is_bool(m) else m


def from_torch_attn_mask(attn_mask, num_heads: int | None = None) -> np.ndarray:
    """torch MHA ``attn_mask`` -> ours.

    (Lq, Lk) stays (Lq, Lk); (B*H, Lq, Lk) becomes (B, H, Lq, Lk) and needs ``num_heads``.
    bool True = ignore becomes True = may attend; float masks are kept as they are (added).
    """
    m = _our_mask(attn_mask, "attn_mask")
    if m.ndim == 3:
        num_heads = None if num_heads is None else as_int(num_heads, "num_heads", minimum=1)
        if num_heads is None or m.shape[0] % num_heads != 0:
            raise ValueError(f"a 3-D attn_mask {m.shape} is (B*H, Lq, Lk): pass num_heads dividing {m.shape[0]}")
        m = m.reshape(m.shape[0] // num_heads, num_heads, *m.shape[1:])  # (B, H, Lq, Lk)
    elif m.ndim != 2:
        raise ValueError(f"attn_mask must be (Lq, Lk) or (B*H, Lq, Lk), got shape {m.shape}")
    return ~m if _is_bool(m) else m


def to_torch_attn_mask(mask, batch_size: int | None = None, num_heads: int | None = None) -> np.ndarray:
    """Our mask -> torch MHA ``attn_mask``: (Lq, Lk), or (B*H, Lq, Lk) for per-batch masks.

    bool True = may attend becomes True = ignore; float masks are kept (added).
    A 4-D mask is broadcast to (B, H, Lq, Lk) (needs ``batch_size`` and ``num_heads``) and flattened.
    """
    m = _our_mask(mask, "mask")
    if m.ndim == 4:
        if batch_size is None or num_heads is None:
            raise ValueError(f"a 4-D mask {m.shape} needs batch_size and num_heads to become (B*H, Lq, Lk)")
        B, H = as_int(batch_size, "batch_size", minimum=1), as_int(num_heads, "num_heads", minimum=1)
        Lq, Lk = m.shape[2], m.shape[3]
        if m.shape[0] not in (1, B) or m.shape[1] not in (1, H):
            raise ValueError(f"mask with shape {m.shape} does not broadcast to (batch_size, num_heads, Lq, Lk) = "
                             f"{(B, H, Lq, Lk)}")  # fmt: skip
        m = np.broadcast_to(m, (B, H, Lq, Lk)).reshape(B * H, Lq, Lk)
    elif m.ndim != 2:
        raise ValueError(f"mask must be (Lq, Lk) or (B, H, Lq, Lk), got shape {m.shape}")
    return ~m if _is_bool(m) else m.copy()


# --------------------------------------------------------------------------- SDPA and HF


def from_sdpa_mask(attn_mask) -> np.ndarray:
    """torch SDPA ``attn_mask`` -> ours: same convention (bool True = attend, float added)."""
    return _our_mask(attn_mask, "attn_mask").copy()


def to_sdpa_mask(mask) -> np.ndarray:
    """Ours -> torch SDPA ``attn_mask``: same convention (bool True = attend, float added)."""
    return _our_mask(mask, "mask").copy()


def to_hf_attention_mask(mask) -> np.ndarray:
    """Our key padding mask (B, 1, 1, Lk) -> Hugging Face ``attention_mask`` (B, Lk), 1 = keep."""
    m = as_array(mask, "mask")
    if not _is_bool(m) or m.ndim != 4 or m.shape[1:3] != (1, 1):
        raise ValueError(f"to_hf_attention_mask needs a bool key padding mask (B, 1, 1, Lk), got {m.dtype} {m.shape}")
    return m[:, 0, 0, :].astype(np.int64)


def from_hf_attention_mask(attention_mask) -> np.ndarray:
    """Hugging Face ``attention_mask`` (B, Lk), 1 = keep -> ours (B, 1, 1, Lk)."""
    return padding_mask(attention_mask=attention_mask)


# --------------------------------------------------------------------------- HF extended (additive) masks


def to_hf_extended_mask(mask, dtype=np.float64) -> np.ndarray:
    """Our bool mask (True = may attend) -> Hugging Face's additive "extended" mask.

    What HF's eager BERT adds to the scores: 0 where a key is kept and ``finfo(dtype).min`` where it is
    blocked (not -inf). The shape is kept; BERT expects (B, 1, Lq, Lk) or (B, 1, 1, Lk).
    A fully blocked row then gives HF *uniform* weights over all keys, not zeros (docs/crosscheck.md).
    """
    m = as_array(mask, "mask")
    if not _is_bool(m):
        raise ValueError(f"to_hf_extended_mask needs a bool mask (True = may attend), got {m.dtype} {m.shape}")
    dtype = _float_dtype(dtype, (np.dtype(np.float16), *FLOAT_DTYPES))  # HF runs in float16 too
    return np.where(m, 0.0, np.finfo(dtype).min).astype(dtype)


def from_hf_extended_mask(extended_mask) -> np.ndarray:
    """Hugging Face's additive extended mask (0 = keep, ``finfo.min`` = blocked) -> ours, bool True = may attend.

    An entry counts as blocked when it is at most half of ``finfo(dtype).min``; any other value is refused,
    because a bool mask cannot carry a bias (use the float mask itself, it is added like ours).
    """
    m = as_array(extended_mask, "extended_mask")
    if not np.issubdtype(m.dtype, np.floating):
        raise ValueError(f"extended_mask must be floating (0 = keep, finfo.min = blocked), got {m.dtype} {m.shape}")
    blocked = m <= np.finfo(m.dtype).min / 2
    if not np.all(blocked | (m == 0)):
        raise ValueError(
            f"extended_mask with shape {m.shape} holds values other than 0 and finfo.min; pass it as a float mask"
        )
    return ~blocked


# --------------------------------------------------------------------------- composing and calling mask_mods


def noop_mask(b, h, q_idx, kv_idx):
    """The mask_mod that allows everything (torch's ``noop_mask``)."""
    return np.ones(np.broadcast_shapes(*(np.shape(x) for x in (b, h, q_idx, kv_idx))), dtype=bool)


def _callables(mask_mods, name: str):
    if not mask_mods or not all(callable(m) for m in mask_mods):
        raise ValueError(f"{name} takes one or more callable mask_mods, got {mask_mods!r:.80}")


def and_masks(*mask_mods):
    """The mask_mod allowing what every one of ``mask_mods`` allows (torch's ``and_masks``)."""
    _callables(mask_mods, "and_masks")

    def and_mask(b, h, q_idx, kv_idx):
        out = mask_mods[0](b, h, q_idx, kv_idx)
        for mod in mask_mods[1:]:
            out = out & mod(b, h, q_idx, kv_idx)
        return out

    return and_mask


def or_masks(*mask_mods):
    """The mask_mod allowing what any one of ``mask_mods`` allows (torch's ``or_masks``)."""
    _callables(mask_mods, "or_masks")

    def or_mask(b, h, q_idx, kv_idx):
        out = mask_mods[0](b, h, q_idx, kv_idx)
        for mod in mask_mods[1:]:
            out = out | mod(b, h, q_idx, kv_idx)
        return out

    return or_mask


def evaluate_mask_mod(mask_mod, b, h, q_idx, kv_idx) -> np.ndarray:
    """mask_mod on one rectangle: b, h 0-d int arrays, q_idx (n, 1), kv_idx (1, m) -> (n, m) bool, or ValueError
    naming ``mask_mod`` (it raised, returned no bool, or a shape that does not broadcast to the rectangle)."""
    shape = (q_idx.shape[0], kv_idx.shape[1])
    try:
        out = mask_mod(b, h, q_idx, kv_idx)
    except Exception as e:  # the user's function: its own error, named
        raise ValueError(f"mask_mod raised {type(e).__name__}: {e}") from e
    dtype = getattr(out, "dtype", None)
    if not isinstance(out, (bool, np.bool_)) and dtype != np.bool_:
        raise ValueError(
            f"mask_mod must return a bool array (True = may attend), got {type(out).__name__} with dtype {dtype} "
            f"and shape {np.shape(out)}"
        )
    try:
        return np.broadcast_to(out, shape)
    except ValueError:
        raise ValueError(f"mask_mod returned shape {np.shape(out)}, which does not broadcast to {shape}") from None
