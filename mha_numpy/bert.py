"""Kept so that old imports keep working: the BERT lives in mha_numpy.models.bert (the same module object)."""

import sys

from .models import bert as _module

sys.modules[__name__] = _module
