"""Which positions of the sequence each rank holds: contiguous or zigzag shards.

A sequence of L positions is cut into equal chunks; each rank holds some of them, side by side in its local arrays
(B, H, L/P, d). ``Sharding(P, "contiguous")``: P chunks, rank r holds chunk r. ``Sharding(P, "zigzag")``: 2P
chunks, rank r holds chunks r and 2P-1-r (the layout of zhuzilin/ring-flash-attention's zigzag ring), so under a
causal mask every rank has the same work: its early chunk sees few keys, its late chunk many.

    L = 8, P = 2    contiguous: rank 0 [0 1 2 3]  rank 1 [4 5 6 7]
                    zigzag:     rank 0 [0 1 | 6 7]  rank 1 [2 3 | 4 5]

A chunk is a (start, stop) pair of global positions; ``chunks(rank)`` are its own in local order, ``positions(rank)``
the global position of each local row. ``shard`` cuts a rank's part out of a whole (B, H, L, ...) array and
``unshard`` puts the P parts back (for checks against the single-process kernel).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

LAYOUTS = ("contiguous", "zigzag")


@dataclass(frozen=True)
class Sharding:
    """P ranks holding a sequence of ``length`` positions in ``layout`` ("contiguous" or "zigzag")."""

    size: int
    layout: str = "contiguous"

    def __post_init__(self):
        if isinstance(self.size, bool) or not isinstance(self.size, (int, np.integer)) or self.size < 1:
            raise ValueError(f"size (the number of ranks) must be a positive int, got {self.size!r}")
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {self.layout!r}")

    @property
    def n_chunks(self) -> int:
        """The number of equal chunks the sequence is cut into: P (contiguous) or 2P (zigzag)."""
        return self.size if self.layout == "contiguous" else 2 * self.size

    def check_length(self, length: int) -> None:
        """ValueError unless ``length`` is a positive multiple of ``n_chunks``."""
        if length < 1 or length % self.n_chunks:
            raise ValueError(f"length {length} must be a positive multiple of {self.n_chunks} ({self.layout} "
                             f"shards of {self.size} ranks: {self.n_chunks} equal chunks)")  # fmt: skip

    def chunk_ids(self, rank: int) -> tuple[int, ...]:
        """The chunks rank holds, in local order."""
        return (rank,) if self.layout == "contiguous" else (rank, 2 * self.size - 1 - rank)

    def chunks(self, rank: int, length: int) -> list[tuple[int, int]]:
        """Rank's chunks as (start, stop) global positions, in local order."""
        self.check_length(length)
        c = length // self.n_chunks
        return [(i * c, (i + 1) * c) for i in self.chunk_ids(rank)]

    def local_slices(self, rank: int, length: int) -> list[slice]:
        """Where each of rank's chunks sits in its local arrays (along L)."""
        c = length // self.n_chunks
        return [slice(n * c, (n + 1) * c) for n in range(len(self.chunk_ids(rank)))]

    def positions(self, rank: int, length: int) -> np.ndarray:
        """(L/P,) the global position of each local row of rank."""
        return np.concatenate([np.arange(a, b) for a, b in self.chunks(rank, length)])

    def shard(self, x: np.ndarray, rank: int, axis: int = 2) -> np.ndarray:
        """Rank's part of a whole array x (..., L, ...) along ``axis``: (..., L/P, ...)."""
        return np.take(x, self.positions(rank, x.shape[axis]), axis=axis)

    def unshard(self, parts: list[np.ndarray], axis: int = 2) -> np.ndarray:
        """The P ranks' parts (..., L/P, ...) -> the whole array (..., L, ...) in sequence order."""
        length = sum(p.shape[axis] for p in parts)
        whole = np.concatenate(parts, axis=axis)  # (..., L, ...) in rank order
        order = np.concatenate([self.positions(r, length) for r in range(self.size)])  # (L,) position of each row
        return np.take(whole, np.argsort(order), axis=axis)
