"""Interchangeable ways to compute the same attention on (B, H, L, d) arrays, and the one registry.

    vectorized  ``functional``'s pairs batched over (B, H): the whole (B, H, Lq, Lk) score tensor
    naive       the same pairs one (batch item, head) at a time: the formula read literally
    chunked     blocked online softmax (FlashAttention-style) on a thread pool: memory O(L · block)
    auto        one of the two above per call, by a documented rule on the shape (``auto.py``)

and, not registered (it wraps one of them, ``SplitKVKernel(num_shards, inner)``; tests/test_split_kv.py checks it):

    split_kv    another kernel on S shards of the keys, merged exactly by their lse (split-KV decoding, ``split_kv.py``)

The protocol (``base.Kernel``): ``forward(q, k, v, mask=None, scale=None, dropout_p=0.0, rng=None,
dropout_mask=None, bias=None, score_mods=(), sinks=None) -> (context, cache)`` and ``backward(d_context, cache,
d_lse=None) -> (dq, dk, dv, d_bias, d_sinks)``; the cache carries its kernel and exposes ``attn_weights`` and each
row's log-sum-exp ``lse``. ``get_kernel`` is the only place a name is resolved: ``MultiHeadAttention(impl=...)``
takes a registered name or a kernel object. A new kernel is one file here and one ``register`` call; the conformance
tests pick it up from ``KERNELS``.
"""

from __future__ import annotations

from .auto import AutoKernel
from .base import CACHE_ATTRIBUTES, AttentionArgs, Kernel, ScoreMod, check_args
from .chunked import ChunkedKernel
from .naive import NaiveKernel
from .split_kv import SplitKVKernel
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

__all__ = ["AttentionArgs", "Kernel", "KERNELS", "register", "get_kernel", "check_args", "ScoreMod", "CACHE_ATTRIBUTES"]
__all__ += ["VectorizedKernel", "NaiveKernel", "ChunkedKernel", "AutoKernel", "SplitKVKernel"]
