"""Which pieces of one ring step a rank computes, and the whole schedule (which block is where at each step).

At step s of P, rank r holds the keys and values of rank (r - s) mod P, its "block". Its queries and the block's
keys are chunks of the sequence (``shards.Sharding``); each (query chunk, key chunk) pair is one piece: one call
of the kernel, one partial result for that query chunk. A piece whose every score is masked (a causal mask with all
keys after all queries, or only padding keys) is skipped: this is where the zigzag layout balances the ranks.

    Piece(a, b, rows, cols, mask)   a, b: local indices of the query and key chunk; rows, cols: their slices in
                                    the local arrays; mask: None (all allowed) or bool (B or 1, 1, lq, lk)

``pieces`` is the one place the masks of the ring are made; the forward and the backward both walk it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .shards import Sharding


@dataclass(frozen=True)
class Piece:
    """One query chunk × key chunk of a ring step: where its rows and columns sit, its mask and its work."""

    a: int  # the query chunk (local index)
    b: int  # the key chunk (local index in the block)
    rows: slice  # its queries in the local arrays
    cols: slice  # its keys in the block's arrays
    mask: np.ndarray | None  # (B or 1, 1, lq, lk) bool, True = may attend; None = every score allowed
    entries: int  # allowed scores per (batch item, head): the work of the piece


def pieces(sharding: Sharding, rank: int, owner: int, length: int, causal: bool, key_valid=None) -> list[Piece]:
    """The pieces rank computes with the block of ``owner``, in a fixed order (query chunk, then key chunk).

    causal: query i may attend to key j iff j <= i (global positions). key_valid: None or (B, L) bool, True = a real
    key (the padding mask; the ring's one convention, True = may attend)."""
    out = []
    q_slices, k_slices = sharding.local_slices(rank, length), sharding.local_slices(owner, length)
    for a, (q0, q1) in enumerate(sharding.chunks(rank, length)):
        for b, (k0, k1) in enumerate(sharding.chunks(owner, length)):
            if causal and k0 > q1 - 1:  # every key after every query: nothing to compute
                continue
            allowed = np.ones((1, 1, q1 - q0, k1 - k0), dtype=bool)  # (1, 1, lq, lk)
            if causal and k1 - 1 > q0:  # the diagonal crosses the piece
                allowed = allowed & (np.arange(k0, k1)[None, :] <= np.arange(q0, q1)[:, None])  # (lq, lk)
            if key_valid is not None:
                allowed = allowed & key_valid[:, None, None, k0:k1]  # (B, 1, lq, lk)
            if not allowed.any():
                continue
            entries = int(allowed.sum()) // allowed.shape[0]
            mask = None if allowed.all() else allowed
            out.append(Piece(a, b, q_slices[a], k_slices[b], mask, entries))
    return out


def schedule(sharding: Sharding, length: int, causal: bool) -> list[list[tuple[int, list[Piece]]]]:
    """steps[s][r] = (owner of the block rank r holds at step s, the pieces it computes), no padding."""
    P = sharding.size
    return [[((r - s) % P, pieces(sharding, r, (r - s) % P, length, causal)) for r in range(P)] for s in range(P)]


def work_per_rank(sharding: Sharding, length: int, causal: bool) -> list[int]:
    """The scores each rank computes over the whole ring (per batch item and head): equal for zigzag."""
    steps = schedule(sharding, length, causal)
    return [sum(p.entries for s in steps for p in s[r][1]) for r in range(sharding.size)]
