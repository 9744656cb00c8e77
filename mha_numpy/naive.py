"""Kept so that old imports keep working: the naive kernel is mha_numpy.kernels.naive (the same module object)."""

import sys

from .kernels import naive as _module

sys.modules[__name__] = _module
