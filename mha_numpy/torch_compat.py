"""The torch and Hugging Face interop under its first name: ``from mha_numpy import torch_compat``.

A plain re-export of ``mha_numpy.interop`` (the same functions and the same ``names`` and ``convert`` modules),
kept because notebooks and users' code import it by this name. New code can import ``mha_numpy.interop``.
"""

from .interop import *  # noqa: F403
from .interop import __all__, convert, names  # noqa: F401
