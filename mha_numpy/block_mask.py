"""FlexAttention's block masks in NumPy: ``create_block_mask``, ``BlockMask``, ``and_masks``, ``or_masks``.

A ``mask_mod(b, h, q_idx, kv_idx)`` says which query may attend to which key (True = may attend, our convention
and torch's). Vectorised here: b, h, q_idx, kv_idx are integer arrays that broadcast together (one tile: b and h
0-d, q_idx (n, 1), kv_idx (1, m)) and it returns a bool array of their broadcast shape (``masks.causal_mod``,
``window_mod``, ``document_mod``, ``prefix_lm_mod`` are today's masks in this form).

``create_block_mask`` cuts the (Q_LEN, KV_LEN) mask of every (b, h) into blocks of BLOCK_SIZE = (Q_BLOCK, KV_BLOCK)
and records each block's state, as torch's ``_convert_mask_to_block_mask`` does (the last block row and column
padded with blocked entries, so an edge block is never full):

    empty    no entry allowed: not listed, never computed
    full     every entry allowed (``full_kv_*``): computed without evaluating the mask at all
    partial  both (``kv_*``): computed, the mask_mod evaluated on this block only

with torch's fields: ``kv_num_blocks`` (B, H, nq) the partial blocks per block row and ``kv_indices``
(B, H, nq, nk) their columns, ascending, first (the rest of the row follows: torch's stable argsort),
``full_kv_num_blocks`` / ``full_kv_indices`` the same for the full blocks, and the transposes ``q_num_blocks``,
``q_indices``, ``full_q_num_blocks``, ``full_q_indices`` (B, H, nk) and (B, H, nk, nq), per key block, that a
backward walks. int32, as torch's. B=None and H=None mean 1 (shared by the batch, by the heads).

The mask_mod is evaluated one block row at a time (Q_BLOCK × KV_LEN entries): nothing of size Q_LEN × KV_LEN is
built, so a document mask at L = 32768 costs its blocks' states (KiB), not its entries (1 GiB).

A ``BlockMask`` is a ``masks.StructuredMask``: every kernel takes it as ``mask=``. The vectorized and naive kernels
build its entries (``np.asarray``); the chunked kernel asks its ``classify`` (the blocks' states: a tile of
empty blocks skipped, of full ones computed without a mask), its ``tile`` (only the partial blocks' entries, by
the mask_mod) and its ``key_tiles`` / ``query_tiles`` (the listed blocks alone). Its tiles are the blocks,
Q_BLOCK queries × KV_BLOCK keys (two sides or one), unless a ``block_size`` was set; any other tile is classified
correctly all the same (a tile over several blocks takes their states together; inside a partial block the
mask_mod tells).
"""

from __future__ import annotations

import copy

import numpy as np

from ._checks import as_int
from .masks import EMPTY, FULL, MIXED, PARTIAL, StructuredMask, and_masks, evaluate_mask_mod, noop_mask, or_masks

__all__ = ["BlockMask", "create_block_mask", "and_masks", "or_masks", "noop_mask"]


# --------------------------------------------------------------------------- the block mask


def _ordered(dense: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(…, rows, cols) 0/1 -> (num (…, rows), indices (…, rows, cols)) int32: per row how many are set, and their
    columns first, ascending, then the others, ascending (torch's ``_dense_to_ordered``: a stable descending sort)."""
    num = dense.sum(axis=-1, dtype=np.int32)  # (…, rows)
    indices = np.argsort(-dense.astype(np.int8), axis=-1, kind="stable").astype(np.int32)  # (…, rows, cols)
    return num, indices


class BlockMask(StructuredMask):
    """A mask given by a mask_mod and its blocks' states (``create_block_mask`` makes one; see the module's header).

    shape: (B, H, Q_LEN, KV_LEN) as torch's (B, H = 1 when shared); BLOCK_SIZE: (Q_BLOCK, KV_BLOCK); mask_mod: the
    rule; ``states`` (B, H, nq, nk) int8: ``masks.EMPTY``, ``FULL`` or ``PARTIAL`` per block. The torch fields
    (``kv_num_blocks`` …) are made from ``states`` when first read. ``np.asarray(block_mask)`` is the dense mask
    (B, H, Q_LEN, KV_LEN): a full block allowed, an empty one blocked, a partial one as the mask_mod says.
    """

    def __init__(self, mask_mod, states: np.ndarray, Q_LEN: int, KV_LEN: int, BLOCK_SIZE: tuple[int, int]) -> None:
        self.mask_mod, self.states, self.BLOCK_SIZE = mask_mod, states, tuple(BLOCK_SIZE)
        self.Lq, self.Lk, self.seq_lengths = Q_LEN, KV_LEN, (Q_LEN, KV_LEN)
        self.batch, self.heads = states.shape[:2]
        self.appended, self._also, self._h = 0, (), 0  # keys appended (all allowed); _h: the head the tiles ask about
        self._fields = {}

    # ------------------------------------------------------------------ torch's fields

    def _field(self, name: str) -> np.ndarray:
        if not self._fields:
            partial, full = (self.states == PARTIAL), (self.states == FULL)  # (B, H, nq, nk) each
            f = self._fields
            f["kv_num_blocks"], f["kv_indices"] = _ordered(partial)
            f["full_kv_num_blocks"], f["full_kv_indices"] = _ordered(full)
            f["q_num_blocks"], f["q_indices"] = _ordered(partial.swapaxes(-1, -2))  # (B, H, nk, nq) per key block
            f["full_q_num_blocks"], f["full_q_indices"] = _ordered(full.swapaxes(-1, -2))
        return self._fields[name]

    kv_num_blocks = property(lambda self: self._field("kv_num_blocks"), doc="(B, H, nq) partial blocks per row")
    kv_indices = property(lambda self: self._field("kv_indices"), doc="(B, H, nq, nk) their columns first")
    full_kv_num_blocks = property(lambda self: self._field("full_kv_num_blocks"), doc="(B, H, nq) full blocks")
    full_kv_indices = property(lambda self: self._field("full_kv_indices"), doc="(B, H, nq, nk) their columns")
    q_num_blocks = property(lambda self: self._field("q_num_blocks"), doc="(B, H, nk) partial blocks per column")
    q_indices = property(lambda self: self._field("q_indices"), doc="(B, H, nk, nq) their rows first")
    full_q_num_blocks = property(lambda self: self._field("full_q_num_blocks"), doc="(B, H, nk) full blocks")
    full_q_indices = property(lambda self: self._field("full_q_indices"), doc="(B, H, nk, nq) their rows")

    def to_dense(self) -> np.ndarray:
        """(B, H, nq, nk) int32: 1 where a block is listed (partial or full), as torch's ``BlockMask.to_dense``."""
        return (self.states != EMPTY).astype(np.int32)

    # ------------------------------------------------------------------ a mask like any other

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """(B, H, Q_LEN, KV_LEN) (B, H = 1 when shared; KV_LEN counting appended keys): broadcasts to the scores."""
        return (self.batch, self.heads, self.Lq, self.Lk + self.appended)

    @property
    def nbytes(self) -> int:
        """The bytes of the blocks' states (its entries would take B · H · Q_LEN · KV_LEN)."""
        return self.states.nbytes

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        """The entries, (B, H, Q_LEN, KV_LEN) bool: built now."""
        if copy is False:
            raise ValueError("a BlockMask holds no entries to view: np.asarray builds them")
        out = np.empty(self.shape, dtype=bool)
        for b in range(self.batch):
            for h in range(self.heads):
                out[b, h] = self.head(h).tile(b, 0, self.Lq, 0, self.shape[3])  # (Q_LEN, KV_LEN)
        return out if dtype is None else out.astype(dtype)

    def __repr__(self) -> str:
        listed, full = int((self.states != EMPTY).sum()), int((self.states == FULL).sum())
        blocks = f"listed {listed} of {self.states.size}, full {full}"
        return f"BlockMask(shape={self.shape}, BLOCK_SIZE={self.BLOCK_SIZE}, {blocks})"

    def __getitem__(self, index) -> BlockMask:
        """The batch items and heads ``index`` selects (slices, or ints kept as an axis of 1), as ``mask[:, hs]``;
        its mask_mod sees the original b and h."""
        index = index if isinstance(index, tuple) else (index,)
        if len(index) > 2 or not all(isinstance(i, (slice, int, np.integer)) for i in index):
            raise ValueError(f"a BlockMask is indexed by batch and head (slices or ints), got {index!r:.80}")
        index = tuple(slice(int(i), int(i) + 1 or None) if not isinstance(i, slice) else i for i in index)
        index += (slice(None),) * (2 - len(index))
        b_of, h_of = (np.arange(n)[i] for n, i in zip(self.states.shape[:2], index))  # the original b, h
        mod = self.mask_mod

        def selected(b, h, q_idx, kv_idx):
            return mod(b_of[b], h_of[h], q_idx, kv_idx)

        out = BlockMask(selected, self.states[index], self.Lq, self.Lk, self.BLOCK_SIZE)
        out.appended = self.appended
        return out

    def __and__(self, other) -> BlockMask:
        """Allowed where both allow: ``other`` a BlockMask or a StructuredMask of the same lengths, or a bool key
        padding mask (B, 1, 1, Lk) or (Lk,): a new BlockMask (this one's BLOCK_SIZE) of the mask_mods' ``and_masks``,
        its blocks evaluated again. ``combine_masks`` keeps it a BlockMask so."""
        if isinstance(other, StructuredMask):  # a BlockMask, or a rule (its mask_mod: ``as_mask_mod``)
            if (other.Lq, other.Lk) != (self.Lq, self.Lk):
                raise ValueError(f"masks of shapes {self.shape} and {other.shape} do not combine")
            other_mod = other.mask_mod if isinstance(other, BlockMask) else other.as_mask_mod()
        else:
            keys = np.asarray(other)
            if keys.dtype != np.bool_ or not (
                keys.shape == (self.Lk,) or (keys.ndim == 4 and keys.shape[1:] == (1, 1, self.Lk))
            ):
                raise ValueError(f"a BlockMask combines with another one or with a bool key padding mask (B, 1, 1, "
                                 f"Lk={self.Lk}), got {keys.dtype} {keys.shape}")  # fmt: skip
            keys = keys.reshape(-1, self.Lk)  # (B or 1, Lk)

            def other_mod(b, h, q_idx, kv_idx):
                return keys[b if keys.shape[0] > 1 else 0, kv_idx]

        if self.appended or getattr(other, "appended", 0):
            raise ValueError("a BlockMask with appended keys does not combine")
        B = max(self.batch, other.batch if isinstance(other, StructuredMask) else keys.shape[0])
        H = max(self.heads, other.shape[1] if isinstance(other, StructuredMask) else 1)
        return create_block_mask(
            and_masks(self.mask_mod, other_mod), B, H, self.Lq, self.Lk, BLOCK_SIZE=self.BLOCK_SIZE
        )

    __rand__ = __and__

    # ------------------------------------------------------------------ what the tiles ask

    def head(self, h: int) -> BlockMask:
        """This mask as head h's tiles see it (the same object when the heads share it)."""
        if self.heads == 1:
            return self
        out = copy.copy(self)
        out._h = as_int(h, "h", minimum=0)
        return out

    def _blocks(self, b: int, i0: int, i1: int, j0: int, j1: int) -> np.ndarray:
        """The states of the blocks the rectangle [i0, i1) × [j0, j1) touches, (rows, cols) int8 (a view)."""
        (qb, kb), st = self.BLOCK_SIZE, self.states[b if self.batch > 1 else 0, self._h]  # (nq, nk)
        return st[i0 // qb : -(-i1 // qb), j0 // kb : -(-j1 // kb)]

    def _state(self, b: int, i0: int, i1: int, j0: int, j1: int) -> int:
        """``classify`` on the sequence's keys (j1 <= Lk): from the blocks' states, the mask_mod never called."""
        st = self._blocks(b, i0, i1, j0, j1)
        kinds = (st == EMPTY).any(), (st == FULL).any(), (st == PARTIAL).any()
        if kinds == (True, False, False):
            return EMPTY
        if kinds == (False, True, False):
            return FULL
        return PARTIAL if kinds[2] else MIXED  # empty and full blocks alone: certainly both

    def _entries(self, b: int, i0: int, i1: int, j0: int, j1: int) -> np.ndarray:
        """``tile`` on the sequence's keys (j1 <= Lk): (i1 - i0, j1 - j0) bool, the mask_mod evaluated on the
        rectangle only when a partial block is in it, and its entries kept only inside the partial blocks."""
        st = self._blocks(b, i0, i1, j0, j1)
        qb, kb = self.BLOCK_SIZE
        rows, cols = np.arange(i0, i1), np.arange(j0, j1)  # (n,), (m,)
        at = st[(rows // qb - i0 // qb)[:, None], (cols // kb - j0 // kb)[None, :]]  # (n, m) each entry's block state
        out = at == FULL
        if (st == PARTIAL).any():
            b = b if self.batch > 1 else 0  # a mask shared by the batch is item 0's (torch calls it with b = 0)
            index = np.int64(b), np.int64(self._h), rows[:, None], cols[None, :]  # 0-d, 0-d, (n, 1), (1, m)
            out |= (at == PARTIAL) & evaluate_mask_mod(self.mask_mod, *index)
        return out

    def key_range(self, b: int, i0: int, i1: int) -> tuple[int, int]:
        """(j_lo, j_hi): the span of the listed blocks of the block rows holding queries i0 ... i1 - 1."""
        listed = np.flatnonzero((self._blocks(b, i0, i1, 0, self.Lk) != EMPTY).any(axis=0))  # block columns
        if listed.size == 0:
            return 0, 0
        kb = self.BLOCK_SIZE[1]
        return int(listed[0]) * kb, min(int(listed[-1] + 1) * kb, self.Lk)

    def query_range(self, b: int, j0: int, j1: int) -> tuple[int, int]:
        """(i_lo, i_hi): the span of the listed blocks of the block columns holding keys j0 ... j1 - 1 (all queries
        for an appended key)."""
        if j1 > self.Lk:
            return 0, self.Lq
        listed = np.flatnonzero((self._blocks(b, 0, self.Lq, j0, j1) != EMPTY).any(axis=1))  # block rows
        if listed.size == 0:
            return 0, 0
        qb = self.BLOCK_SIZE[0]
        return int(listed[0]) * qb, min(int(listed[-1] + 1) * qb, self.Lq)

    def key_tiles(self, b: int, i0: int, i1: int, bk: int) -> list[int]:
        """The first keys of the tiles of bk keys that hold a listed block of the block rows of queries i0 ... i1 - 1
        (and the appended keys'): exactly the listed blocks when bk = KV_BLOCK; no tile of unlisted blocks."""
        kb = self.BLOCK_SIZE[1]
        cols = np.flatnonzero((self._blocks(b, i0, i1, 0, self.Lk) != EMPTY).any(axis=0))  # listed block columns
        first, last = cols * kb // bk, (np.minimum((cols + 1) * kb, self.Lk) - 1) // bk  # the tiles each touches
        tiles = {int(t) for f, la in zip(first, last) for t in range(f, la + 1)}
        if self.appended:
            tiles |= set(range(self.Lk // bk, -(-(self.Lk + self.appended) // bk)))
        return [t * bk for t in sorted(tiles)]

    def query_tiles(self, b: int, j0: int, j1: int, bq: int) -> list[int]:
        """The first queries of the tiles of bq queries that hold a listed block of the block columns of keys
        j0 ... j1 - 1 (every query for an appended key)."""
        if j1 > self.Lk:
            return list(range(0, self.Lq, bq))
        qb = self.BLOCK_SIZE[0]
        rows = np.flatnonzero((self._blocks(b, 0, self.Lq, j0, j1) != EMPTY).any(axis=1))  # listed block rows
        first, last = rows * qb // bq, (np.minimum((rows + 1) * qb, self.Lq) - 1) // bq
        return [t * bq for t in sorted({int(t) for f, la in zip(first, last) for t in range(f, la + 1)})]


def _block_size(BLOCK_SIZE) -> tuple[int, int]:
    if isinstance(BLOCK_SIZE, tuple) and len(BLOCK_SIZE) == 2:
        return as_int(BLOCK_SIZE[0], "BLOCK_SIZE[0]", minimum=1), as_int(BLOCK_SIZE[1], "BLOCK_SIZE[1]", minimum=1)
    if isinstance(BLOCK_SIZE, tuple):
        raise ValueError(f"BLOCK_SIZE must be an int or a pair (Q_BLOCK, KV_BLOCK), got {BLOCK_SIZE!r:.60}")
    n = as_int(BLOCK_SIZE, "BLOCK_SIZE", minimum=1)
    return n, n


def create_block_mask(mask_mod, B, H, Q_LEN, KV_LEN, device=None, BLOCK_SIZE=128) -> BlockMask:
    """The ``BlockMask`` of ``mask_mod`` for B batch items, H heads, Q_LEN queries and KV_LEN keys (torch's order and
    meaning; B or H None = 1, shared; ``device`` accepted and ignored). BLOCK_SIZE: an int or (Q_BLOCK, KV_BLOCK).

    mask_mod(b, h, q_idx, kv_idx) is called once per (b, h, block row) with b, h 0-d int64 arrays, q_idx (Q_BLOCK, 1)
    and kv_idx (1, KV_LEN), and must return a bool array broadcasting to (Q_BLOCK, KV_LEN) (ValueError naming it
    otherwise). Memory: O(Q_BLOCK · KV_LEN) at a time, never Q_LEN × KV_LEN.
    """
    if not callable(mask_mod):
        raise ValueError(f"mask_mod must be callable (b, h, q_idx, kv_idx) -> bool array, got {mask_mod!r:.60}")
    B = 1 if B is None else as_int(B, "B", minimum=1)
    H = 1 if H is None else as_int(H, "H", minimum=1)
    Q_LEN, KV_LEN = as_int(Q_LEN, "Q_LEN", minimum=1), as_int(KV_LEN, "KV_LEN", minimum=1)
    qb, kb = _block_size(BLOCK_SIZE)
    nq, nk = -(-Q_LEN // qb), -(-KV_LEN // kb)
    states = np.empty((B, H, nq, nk), dtype=np.int8)
    kv_idx = np.arange(KV_LEN)[None, :]  # (1, KV_LEN)
    per_key = np.zeros(nk * kb, dtype=np.int64)  # allowed queries per key of a block row; the padding keys: none
    for b in range(B):
        for h in range(H):
            for r in range(nq):
                q_idx = np.arange(r * qb, min((r + 1) * qb, Q_LEN))[:, None]  # (n, 1) the block row's queries
                allowed = evaluate_mask_mod(mask_mod, np.int64(b), np.int64(h), q_idx, kv_idx)  # (n, KV_LEN)
                per_key[:KV_LEN] = allowed.view(np.uint8).sum(axis=0, dtype=np.int64)  # (KV_LEN,); padding rows: none
                count = per_key.reshape(nk, kb).sum(axis=1)  # (nk,) allowed entries per block
                states[b, h, r] = np.where(count == 0, EMPTY, np.where(count == qb * kb, FULL, PARTIAL))
    return BlockMask(mask_mod, states, Q_LEN, KV_LEN, (qb, kb))
