"""Masks in mha_numpy's one convention, and converters at the edges.

Inside mha_numpy a mask is either
- boolean, ``True`` = this query **may attend** to this key, or
- floating, **added** to the scores (0 = keep, -inf = block; other values bias the scores),
with any shape that broadcasts to the scores (B, H, Lq, Lk).

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


def causal_mask(Lq: int, Lk: int | None = None, diagonal: int = 0) -> np.ndarray:
    """(Lq, Lk) bool, True where key j <= query i + diagonal.

    With Lq != Lk this is aligned top-left, like ``torch.tril(ones(Lq, Lk), diagonal)`` and
    torch SDPA's ``is_causal=True``. For a decoder that appends Lq new queries after Lk - Lq
    cached keys (bottom-right alignment) pass ``diagonal=Lk - Lq``.
    """
    Lq = as_int(Lq, "Lq", minimum=1)
    Lk = Lq if Lk is None else as_int(Lk, "Lk", minimum=1)
    diagonal = as_int(diagonal, "diagonal")  # any sign; beyond [-Lq, Lk] the mask no longer changes
    return np.tril(np.ones((Lq, Lk), dtype=bool), k=min(max(diagonal, -Lq), Lk))


def sliding_window_mask(Lq: int, Lk: int, window: int, causal: bool = True, offset: int = 0) -> np.ndarray:
    """(Lq, Lk) bool local-attention mask, True where query i may attend to key j.

    Query i sits at position i + offset (top-left aligned by default, like ``causal_mask``; pass
    ``offset=Lk - Lq`` for Lq new queries after Lk - Lq cached keys). With p = i + offset:
    - causal=True: the last ``window`` keys up to and including p, p - window < j <= p (Mistral's convention);
    - causal=False (symmetric): |p - j| < window, i.e. window - 1 keys on each side and p itself.
    ``window >= Lk`` with causal=True is ``causal_mask(Lq, Lk, diagonal=offset)``.
    Lq, Lk, window: positive ints; offset: an int of any sign; causal: a bool (ValueError otherwise: a float
    offset would put a query between two keys).
    """
    Lq, Lk, window = as_int(Lq, "Lq", minimum=1), as_int(Lk, "Lk", minimum=1), as_int(window, "window", minimum=1)
    causal, offset = as_bool(causal, "causal"), as_int(offset, "offset")
    offset = min(max(offset, -(Lq + window)), Lk + window)  # beyond these every p - j is out of every window
    delta = np.arange(Lq)[:, None] + offset - np.arange(Lk)[None, :]  # (Lq, Lk): p - j
    if causal:
        return (delta >= 0) & (delta < window)
    return np.abs(delta) < window


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
    Integer masks are refused with a ValueError naming ``masks[i]``: a 0/1 mask is "1 = keep" in Hugging Face,
    and adding it would make a +1 bias (or, turned into an int -inf, INT64_MIN); convert it explicitly first.
    """
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
