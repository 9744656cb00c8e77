"""Top-k selection per query, and the selection as a mask (``TopKSelection``): which keys each query attends to.

    index = topk_select(scores, k, mask)    scores (B, Lq, Lk), index (B, Lq, min(k, Lk)) int32

Query i keeps the k keys of highest score among those ``mask`` allows, in ascending key order, the rest of its row
-1 (no key) when fewer than k are allowed. The rules, the same whatever the block size:

- k >= Lk: every allowed key (nothing is dropped; the row is the mask's row).
- ties at the k-th score: the keys of lower index first (j < j' at equal scores: j is kept). Deterministic, not
  torch's (``torch.topk`` leaves ties to its kernel): the k-th largest value v_i is found by ``np.partition``, every
  key above it is kept, and of the keys equal to it the first k - (number above) by index.
- a masked key is never selected, whatever its score (a causal row i < k has i + 1 keys, and k - i - 1 slots -1;
  Hugging Face's indexer lets ``topk`` pick -inf scores there and masks them again in the attention).

``TopKSelection(index, Lk)`` is a ``masks.StructuredMask`` (bool (B, 1, Lq, Lk), True at the selected keys) given
by its index instead of its entries: every kernel takes it as ``mask=`` (the vectorized and naive ones build its
entries, the chunked one asks it for tiles), and ``sparse_attention.SparseKernel`` gathers the selected keys
from its index, never building (Lq, Lk). ``selection & causal_mask(L, structured=True)`` keeps the selection on top;
``checked_index`` refuses a selected key that such a mask blocks.

The index is int32 wherever it is stored (``INDEX_DTYPE``: half of int64's L · k · 8 bytes, 256 MiB instead of 512 at
L = 32768, k = 2048; transformers' indexer returns int32 too): keys up to 2³¹ - 1, far beyond any (Lk, d) key array
this library could hold.
"""

from __future__ import annotations

import numpy as np

from .._checks import as_array, as_float_array, as_int
from ..masks import EMPTY, PARTIAL, StructuredMask

QUERY_BLOCK = 256  # rows of scores handled at once: O(QUERY_BLOCK · Lk) temporaries
INDEX_DTYPE = np.int32  # a selected key's number, -1 for none (the module docstring)


def _allowed_rows(mask, b: int, i0: int, i1: int, Lk: int) -> np.ndarray | bool:
    """(i1 - i0, Lk) bool: the keys ``mask`` allows to queries i0 ... i1 - 1 of batch item b (True: no mask)."""
    if mask is None:
        return True
    if isinstance(mask, StructuredMask):
        return mask.tile(b if mask.batch > 1 else 0, i0, i1, 0, Lk)
    return mask[b if mask.shape[0] > 1 else 0, i0:i1]  # (n, Lk)


def mask_rows(mask, i0: int, i1: int, Lk: int) -> np.ndarray | None:
    """A checked mask's (``check_selection_mask``) rows for queries i0 ... i1 - 1 -> None or bool (b, n, Lk)."""
    if mask is None:
        return None
    batch = mask.batch if isinstance(mask, StructuredMask) else mask.shape[0]
    return np.stack([np.broadcast_to(_allowed_rows(mask, b, i0, i1, Lk), (i1 - i0, Lk)) for b in range(batch)])


def check_selection_mask(mask, shape) -> np.ndarray | StructuredMask | None:
    """``mask`` for scores of ``shape`` (B, Lq, Lk): None, bool (Lq, Lk), (b, Lq, Lk), (b, 1, Lq, Lk) (b: 1 or B), or a
    StructuredMask of (Lq, Lk); as an array (b, Lq, Lk) broadcast over the queries and keys, or ValueError."""
    B, Lq, Lk = shape
    if mask is None:
        return None
    if isinstance(mask, StructuredMask):
        if mask.shape[2:] != (Lq, Lk) or mask.batch not in (1, B) or mask.shape[1] != 1:
            raise ValueError(f"mask is a StructuredMask of shape {mask.shape}; the scores (B, Lq, Lk) = {shape} need "
                             f"(1 or B, 1, Lq, Lk)")  # fmt: skip
        return mask
    m = as_array(mask, "mask")
    if m.dtype != np.bool_:
        raise ValueError(f"mask must be bool (True = may attend), got dtype {m.dtype} with shape {m.shape}")
    m = m[:, 0] if m.ndim == 4 and m.shape[1] == 1 else m[None] if m.ndim == 2 else m  # -> (b, Lq, Lk)
    if m.ndim != 3 or m.shape[0] not in (1, B):
        raise ValueError(f"mask with shape {np.shape(mask)} must be (Lq, Lk), (1 or B, Lq, Lk) or (1 or B, 1, Lq, Lk)"
                         f" with B = {B}")  # fmt: skip
    try:
        return np.broadcast_to(m, (m.shape[0], Lq, Lk))
    except ValueError:
        raise ValueError(f"mask with shape {np.shape(mask)} does not broadcast to (Lq, Lk) = ({Lq}, {Lk})") from None


def topk_select(scores: np.ndarray, k: int, mask=None, block_size: int = QUERY_BLOCK) -> np.ndarray:
    """scores (B, Lq, Lk) float, k >= 1, mask None / bool / StructuredMask (True = may attend) -> index
    (B, Lq, min(k, Lk)) int32: each query's k best allowed keys in ascending key order, -1 where it has fewer
    (the module docstring's rules: ties by lower index, masked keys never). Memory O(block_size · Lk)."""
    k = as_int(k, "k", minimum=1)
    s = as_float_array(scores, "scores", ndim=3)
    B, Lq, Lk = s.shape
    mask = check_selection_mask(mask, s.shape)
    if not np.all(np.isfinite(s)):
        raise ValueError(f"scores with shape {s.shape} holds non-finite values: mask keys with mask=, not -inf")
    k = min(k, Lk)
    index = np.full((B, Lq, k), -1, dtype=INDEX_DTYPE)
    for b in range(B):
        for i0 in range(0, Lq, block_size):
            i1 = min(i0 + block_size, Lq)
            allowed = np.broadcast_to(_allowed_rows(mask, b, i0, i1, Lk), (i1 - i0, Lk))  # (n, Lk)
            work = np.where(allowed, s[b, i0:i1], -np.inf)  # (n, Lk): a masked key below every allowed one
            index[b, i0:i1] = _best_k(work, allowed, k)
    return index


def _best_k(work: np.ndarray, allowed: np.ndarray, k: int) -> np.ndarray:
    """(n, Lk) scores (-inf where masked), their allowed keys -> (n, k) the k best allowed keys by ascending index."""
    n, Lk = work.shape
    kth = -np.partition(-work, k - 1, axis=-1)[:, k - 1 : k]  # (n, 1) the k-th largest score of each row
    above = work > kth  # (n, Lk) kept: fewer than k of them
    level = work == kth  # (n, Lk) the ties at the k-th score: the first ones by index fill the row
    need = k - above.sum(axis=-1, keepdims=True)  # (n, 1) >= 1
    chosen = (above | (level & (np.cumsum(level, axis=-1) <= need))) & allowed  # (n, Lk), at most k a row
    rows, cols = np.nonzero(chosen)  # row-major: each row's keys ascending
    rank = np.cumsum(chosen, axis=-1)[rows, cols] - 1  # the slot of each chosen key in its row
    out = np.full((n, k), -1, dtype=INDEX_DTYPE)
    out[rows, rank] = cols
    return out


def check_index(index, Lk: int, name: str = "index") -> np.ndarray:
    """index (B, Lq, k) integer, each entry a key 0 ... Lk - 1 or -1 (none), no key twice in a row -> as int32 (no
    copy when it is int32 already), or ValueError naming ``name``. A key twice would count twice in the softmax."""
    idx = as_array(index, name)
    if not np.issubdtype(idx.dtype, np.integer) or idx.ndim != 3 or idx.shape[-1] < 1:
        raise ValueError(f"{name} must be an integer array (B, Lq, k >= 1), got dtype {idx.dtype} shape {idx.shape}")
    if Lk > np.iinfo(INDEX_DTYPE).max + 1:
        raise ValueError(f"Lk={Lk} keys: an int32 {name} numbers at most 2**31 keys")
    if idx.size and (idx.min() < -1 or idx.max() >= Lk):
        raise ValueError(f"{name} holds keys outside -1 ... Lk - 1 = {Lk - 1}: min {idx.min()}, max {idx.max()}")
    s = np.sort(idx, axis=-1)  # (B, Lq, k)
    twice = (s[..., 1:] == s[..., :-1]) & (s[..., 1:] >= 0)
    if np.any(twice):
        b, i, _ = np.argwhere(twice)[0]
        raise ValueError(f"{name} selects a key twice for query {i} of batch item {b}: {idx[b, i].tolist()}")
    return idx.astype(INDEX_DTYPE, copy=False)  # every entry in -1 ... Lk - 1 < 2³¹: exact


class TopKSelection(StructuredMask):
    """The selected keys as a bool mask (b, 1, Lq, Lk), True at ``index``'s keys (-1: none), from the index alone:
    O(Lq · k) memory. A ``StructuredMask``: ``np.asarray`` builds the entries, ``tile`` / ``classify`` /
    ``key_range`` answer from the index, ``selection & other`` keeps the selection on top (either order).

    index (b, Lq, k) integer (``check_index``), Lk the number of keys."""

    def __init__(self, index, Lk: int) -> None:
        Lk = as_int(Lk, "Lk", minimum=1)
        idx = check_index(index, Lk)
        super().__init__(idx.shape[1], Lk)  # the rule of nothing: every key allowed, refined by the index below
        self.index = idx.copy()  # (b, Lq, k), ours: a caller's array may change afterwards
        self.index.flags.writeable = False
        self.batch, self.k = idx.shape[0], idx.shape[2]

    @property
    def nbytes(self) -> int:
        """The index's bytes (its entries would take b · Lq · Lk)."""
        return self.index.nbytes + sum(m.nbytes for m in self._also)

    def __repr__(self) -> str:
        also = f", and {len(self._also)} mask(s)" if self._also else ""
        return f"TopKSelection(batch={self.batch}, Lq={self.Lq}, Lk={self.Lk}, k={self.k}{also})"

    def __rand__(self, other) -> TopKSelection:
        """``other & selection``: the selection stays on top (a kernel finds its index on the mask it is given)."""
        return self & other

    def _entries(self, b: int, i0: int, i1: int, j0: int, j1: int) -> np.ndarray:
        """(i1 - i0, j1 - j0) bool: True at the selected keys j0 ... j1 - 1 of queries i0 ... i1 - 1 (and ANDed)."""
        idx = self.index[b if self.batch > 1 else 0, i0:i1]  # (n, k)
        rows, slots = np.nonzero((idx >= j0) & (idx < j1))
        t = np.zeros((i1 - i0, j1 - j0), dtype=bool)
        t[rows, idx[rows, slots] - j0] = True
        for m in self._also:
            t &= m._entries(b, i0, i1, j0, j1)
        return t

    def _state(self, b: int, i0: int, i1: int, j0: int, j1: int) -> int:
        """EMPTY when no query of the rectangle selected a key in it; else PARTIAL (the entries tell)."""
        idx = self.index[b if self.batch > 1 else 0, i0:i1]
        return PARTIAL if np.any((idx >= j0) & (idx < j1)) else EMPTY

    def key_range(self, b: int, i0: int, i1: int) -> tuple[int, int]:
        """(first selected key, last + 1) over queries i0 ... i1 - 1 (an empty range when none is selected)."""
        idx = self.index[b if self.batch > 1 else 0, i0:i1]
        chosen = idx[idx >= 0]
        return (int(chosen.min()), int(chosen.max()) + 1) if chosen.size else (0, 0)

    def query_range(self, b: int, j0: int, j1: int) -> tuple[int, int]:
        """(first query, last + 1) that selected a key j0 ... j1 - 1."""
        idx = self.index[b if self.batch > 1 else 0]  # (Lq, k)
        rows = np.nonzero(np.any((idx >= j0) & (idx < j1), axis=-1))[0]
        return (int(rows[0]), int(rows[-1]) + 1) if rows.size else (0, 0)

    def checked_index(self) -> np.ndarray:
        """The index, after checking that no mask ANDed with the selection blocks a selected key (ValueError naming
        ``mask``): a kernel that reads only the index must not drop what the other masks say."""
        for m in self._also:
            check_index_allowed(self.index, m, "mask")
        return self.index


def check_index_allowed(index: np.ndarray, mask, name: str = "index", block_size: int = QUERY_BLOCK) -> None:
    """ValueError naming ``name`` when ``mask`` (bool (b, Lq, Lk) / (b, 1, Lq, Lk) or a StructuredMask) blocks a key
    ``index`` (B, Lq, k) selects; checked query block by query block (O(block_size · Lk))."""
    B, Lq, _ = index.shape
    Lk = mask.Lk if isinstance(mask, StructuredMask) else np.shape(mask)[-1]
    mask = check_selection_mask(mask, (B, Lq, Lk))
    for b in range(B):
        for i0 in range(0, Lq, block_size):
            i1 = min(i0 + block_size, Lq)
            idx = index[b, i0:i1]  # (n, k)
            allowed = np.broadcast_to(_allowed_rows(mask, b, i0, i1, Lk), (i1 - i0, Lk))
            bad = (idx >= 0) & ~np.take_along_axis(allowed, np.maximum(idx, 0), axis=-1)  # (n, k)
            if np.any(bad):
                i, slot = np.argwhere(bad)[0]
                raise ValueError(f"{name} selects key {idx[i, slot]} for query {i0 + i} of batch item {b}, which "
                                 "the mask blocks: a masked key is never selected (topk_select(.., mask))")  # fmt: skip
