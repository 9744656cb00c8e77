"""The ring's communication: each rank sends to the next and receives from the previous, without blocking.

``Ring(comm)`` wraps an mpi4py communicator (``MPI.COMM_WORLD``). ``ring.shift(a, b)`` posts a receive of the
previous rank's arrays and a send of ``a, b`` to the next rank (``Irecv``/``Isend``) and returns at once, so the
caller computes while the arrays travel; ``.wait()`` returns what came from the previous rank. It counts the bytes
this rank sent (``bytes_sent``). With one rank the ring is one rank long: a shift returns the arrays themselves.

mpi4py is never imported here: the methods used are the communicator's (``comm.Isend``, ``comm.Irecv``) and its
requests' (``Wait``). ``mpi.world()`` imports it.
"""

from __future__ import annotations

import numpy as np


class Pending:
    """Arrays on their way around the ring: ``wait()`` -> the arrays received from the previous rank."""

    def __init__(self, requests, received, sent):
        self._requests = requests
        self._received = received
        self._sent = sent  # kept alive until the sends complete (MPI reads them while we compute)

    def wait(self) -> list[np.ndarray]:
        """Wait for the sends and receives to complete -> the arrays received from the previous rank."""
        for request in self._requests:
            request.Wait()
        self._sent = None
        return self._received


class Ring:
    """Rank r of P sends to r + 1 and receives from r - 1 (mod P)."""

    def __init__(self, comm):
        self.comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self.next = (self.rank + 1) % self.size
        self.prev = (self.rank - 1) % self.size
        self.bytes_sent = 0

    def shift(self, *arrays: np.ndarray, tag: int = 0) -> Pending:
        """Start sending ``arrays`` to the next rank and receiving the previous rank's (same shapes and dtypes)."""
        sent = [np.ascontiguousarray(a) for a in arrays]
        if self.size == 1:
            return Pending([], sent, None)
        received = [np.empty_like(a) for a in sent]
        requests = [self.comm.Irecv(buf, source=self.prev, tag=tag + i) for i, buf in enumerate(received)]
        requests += [self.comm.Isend(buf, dest=self.next, tag=tag + i) for i, buf in enumerate(sent)]
        self.bytes_sent += sum(a.nbytes for a in sent)
        return Pending(requests, received, sent)
