"""Kept so that old imports keep working: the torch and Hugging Face interop is mha_numpy.interop (same module)."""

import sys

from . import interop as _module

sys.modules[__name__] = _module
