"""Deprecated alias (since 0.3, removed in 0.4): the naive kernel is ``mha_numpy.kernels.naive``.

Importing this module warns (``DeprecationWarning``) and gives the names that ``mha_numpy.naive`` had in 0.1 and
0.2, each the same object as at its new place: ``NaiveKernel`` and ``NaiveCache`` from ``mha_numpy.kernels.naive``,
the protocol (``AttentionArgs``, ``Kernel``) from ``mha_numpy.kernels.base``. The return values are 0.3's, not
0.2's: ``NaiveKernel().backward(d_context, cache, d_lse=None)`` returns five values ``(dq, dk, dv, d_bias,
d_sinks)`` (it returned four), and its cache holds ``lse`` (B, H, Lq). CHANGELOG.md lists every change of 0.3.
"""

import warnings

from ._checks import check_d_context
from .kernels.base import AttentionArgs, Kernel
from .kernels.naive import NaiveCache, NaiveKernel

__all__ = ["NaiveKernel", "NaiveCache", "AttentionArgs", "Kernel", "check_d_context"]

warnings.warn(
    "mha_numpy.naive is deprecated since 0.3 and goes in 0.4: import mha_numpy.kernels.naive (NaiveKernel, "
    "NaiveCache) instead; NaiveKernel.backward now returns five values (dq, dk, dv, d_bias, d_sinks)",
    DeprecationWarning,
    stacklevel=2,
)
