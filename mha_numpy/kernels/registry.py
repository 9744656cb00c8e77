"""The registry of kernels by name: ``get_kernel`` is the only place a name (``impl="chunked"``) is resolved."""

from __future__ import annotations

from .auto import AutoKernel
from .base import Kernel
from .chunked import ChunkedKernel
from .naive import NaiveKernel
from .vectorized import VectorizedKernel

KERNELS: dict[str, type[Kernel]] = {}


def register(name: str, kernel_class: type[Kernel]) -> None:
    """Make ``name`` resolve to ``kernel_class()`` (with keyword options, if it takes any)."""
    KERNELS[name] = kernel_class


def get_kernel(impl="vectorized", **options) -> Kernel:
    """A registered name (with its options, e.g. block_size for "chunked") or a kernel object -> a kernel."""
    if isinstance(impl, str):
        if impl not in KERNELS:
            raise ValueError(f"impl must be one of {tuple(KERNELS)} or a kernel object, got {impl!r}")
        options = {name: value for name, value in options.items() if value is not None}
        try:
            return KERNELS[impl](**options)
        except TypeError:
            raise ValueError(f"impl={impl!r} takes no options {sorted(options)}") from None
    if isinstance(impl, Kernel):  # its run, backward, choose and matmul are what the module calls
        if any(value is not None for value in options.values()):
            raise ValueError(f"options {sorted(options)} apply to a kernel name, not to the kernel object {impl!r}")
        return impl
    raise ValueError(f"impl must be one of {tuple(KERNELS)} or a mha_numpy.kernels.Kernel object, got {impl!r}")


register("vectorized", VectorizedKernel)
register("naive", NaiveKernel)
register("chunked", ChunkedKernel)
register("auto", AutoKernel)
