"""The two masks the case matrix needs that ``mha_numpy.masks`` does not have yet: small, to be swapped later.

``mha_numpy.masks`` has the padding, causal (any alignment, through ``diagonal``) and sliding-window masks the
matrix uses. Packed documents and rows that a mask blocks completely are built here, in our convention (bool,
True = may attend), until ``mha_numpy.masks`` has a ``document_mask`` of its own (then this file goes).
"""

from __future__ import annotations

import numpy as np


def document_mask(lengths, Lq: int, Lk: int, causal: bool = True) -> np.ndarray:
    """Packed documents, one list of lengths per batch item -> (B, 1, Lq, Lk) bool, True where query i and key j
    lie in the same document and (causal=True) j <= p_i.

    lengths: one list of non-negative ints per batch item (any number of documents); the documents are packed from
    key position 0 on, and keys past them belong to none (rows of queries there are fully masked). Query i sits at
    position p_i = i + Lk - Lq (bottom-right: the last query at the last key, as with a KV cache or chunked
    prefill); needs Lq <= Lk.
    """
    lengths = [np.asarray(n, dtype=np.int64) for n in lengths]
    if any(n.ndim != 1 or (n < 0).any() for n in lengths) or Lq > Lk:
        raise ValueError(f"document_mask needs one list of lengths >= 0 per batch item and Lq <= Lk, got {Lq}, {Lk}")
    B = len(lengths)
    doc = np.full((B, Lk), -1)  # (B, Lk) the document of each key, -1 = none
    for b in range(B):
        starts = np.concatenate([[0], np.cumsum(lengths[b])])  # (n_docs + 1,)
        for i, (lo, hi) in enumerate(zip(starts[:-1], starts[1:])):
            doc[b, lo : min(hi, Lk)] = i
    pos = np.arange(Lq) + (Lk - Lq)  # (Lq,) the query positions
    doc_q = doc[:, pos]  # (B, Lq)
    same = (doc_q[:, :, None] == doc[:, None, :]) & (doc_q[:, :, None] >= 0)  # (B, Lq, Lk)
    if causal:
        same &= np.arange(Lk)[None, None, :] <= pos[None, :, None]
    return same[:, None]  # (B, 1, Lq, Lk)


def blocked_rows_mask(lengths, blocked_queries: int, Lq: int, Lk: int) -> np.ndarray:
    """Key padding by ``lengths`` (B,) (a length 0 blocks every row of its batch item) and the last
    ``blocked_queries`` queries of every item blocked from every key -> (B, 1, Lq, Lk) bool, True = may attend."""
    lengths = np.asarray(lengths, dtype=np.int64)
    keys = np.arange(Lk)[None, :] < lengths[:, None]  # (B, Lk)
    queries = np.arange(Lq) < Lq - blocked_queries  # (Lq,)
    return keys[:, None, None, :] & queries[None, None, :, None]  # (B, 1, Lq, Lk)
