"""Attention beyond one process: ring attention (context parallelism) over MPI, through mpi4py.

    shards.py   which positions each rank holds: contiguous or zigzag (``Sharding``)
    blocks.py   the pieces one ring step computes (causal and padding masks), the whole schedule
    comm.py     the ring's non-blocking send/receive (``Ring.shift``), counting the bytes sent
    ring.py     ``ring_attention_forward`` / ``ring_attention_backward``: the kernel per piece, the merge pair
    mpi.py      mpi4py, imported only when used (``world()``)

A wing: it imports ``functional`` and ``kernels``; nothing in the core imports it. mpi4py is imported lazily, by
``mpi.world()`` only: every function here takes a communicator (``MPI.COMM_WORLD`` or any with Get_rank,
Get_size, Isend, Irecv). docs/distributed.md draws the communication and derives what it costs.
"""

from .blocks import Piece, pieces, schedule, work_per_rank
from .comm import Ring
from .ring import RingCache, ring_attention_backward, ring_attention_forward
from .shards import LAYOUTS, Sharding

__all__ = ["Sharding", "LAYOUTS", "Piece", "pieces", "schedule", "work_per_rank", "Ring", "RingCache"]
__all__ += ["ring_attention_forward", "ring_attention_backward"]
