"""Kept so that old imports keep working: the chunked kernel is mha_numpy.kernels.chunked (the same module object)."""

import sys

from .kernels import chunked as _module

sys.modules[__name__] = _module
