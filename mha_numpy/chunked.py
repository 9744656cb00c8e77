"""Deprecated alias (since 0.3, removed in 0.4): the chunked kernel is ``mha_numpy.kernels.chunked``.

Importing this module warns (``DeprecationWarning``) and gives the names that ``mha_numpy.chunked`` had in 0.1 and
0.2, each the same object as at its new place: the kernel and its cache from ``mha_numpy.kernels.chunked``, the
thread pool (``pooled_matmul``, ``run_items``, ``AVAILABLE_CORES``) from ``mha_numpy.threads``, the protocol
(``AttentionArgs``, ``Kernel``) from ``mha_numpy.kernels.base``. The return values are 0.3's, not 0.2's:
``ChunkedKernel().backward(d_context, cache, d_lse=None)`` returns five values ``(dq, dk, dv, d_bias, d_sinks)``
(it returned four), and its cache holds ``lse`` (B, H, Lq). CHANGELOG.md lists every change of 0.3.
"""

import warnings

from ._checks import check_d_context, positive_int_or_none
from .kernels.base import AttentionArgs, Kernel
from .kernels.chunked import DEFAULT_BLOCK_SIZE, DEFAULT_NUM_THREADS, MIN_PART, ChunkedCache, ChunkedKernel
from .threads import AVAILABLE_CORES, pooled_matmul, run_items

__all__ = ["ChunkedKernel", "ChunkedCache", "DEFAULT_BLOCK_SIZE", "DEFAULT_NUM_THREADS", "MIN_PART"]
__all__ += ["AttentionArgs", "Kernel", "AVAILABLE_CORES", "pooled_matmul", "run_items"]
__all__ += ["check_d_context", "positive_int_or_none"]

warnings.warn(
    "mha_numpy.chunked is deprecated since 0.3 and goes in 0.4: import mha_numpy.kernels.chunked "
    "(ChunkedKernel, ChunkedCache) and mha_numpy.threads (pooled_matmul, run_items, AVAILABLE_CORES) instead; "
    "ChunkedKernel.backward now returns five values (dq, dk, dv, d_bias, d_sinks)",
    DeprecationWarning,
    stacklevel=2,
)
