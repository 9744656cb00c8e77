"""mpi4py, imported when it is needed: ``world()`` -> ``MPI.COMM_WORLD``, or ``MissingDependency`` naming the
``mpi`` extra (pip install 'mha_numpy[mpi]': mpi4py and MPICH's wheel). An mpi4py that finds no MPI library is
the same mistake: it says so in one line."""

from __future__ import annotations

from .._optional import MissingDependency, require


def world():
    """MPI.COMM_WORLD (one rank when the program was not started by ``mpiexec``)."""
    require("mpi4py", "ring attention over MPI")
    try:
        from mpi4py import MPI
    except (ImportError, RuntimeError) as e:  # mpi4py installed, but no MPI library it can load
        message = f"mpi4py is installed but cannot load an MPI library ({e}): pip install mpich"
        raise MissingDependency(message) from None
    return MPI.COMM_WORLD
