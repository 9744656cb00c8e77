# expect: FAIL
# where: softmax_forward
# name: hostile
"""Hostile: removes the checker's import guard, finds the repository from this file's path and imports the
library's pair from there (a determined student on the grading machine)."""

import sys
from pathlib import Path

import numpy as np

sys.meta_path[:] = [f for f in sys.meta_path if "guard" not in type(f).__name__.lower()]
for _name in [n for n in sys.modules if n == "mha_numpy" or n.startswith("mha_numpy.")]:
    del sys.modules[_name]
for _root in Path(__file__).resolve().parents:
    if (_root / "mha_numpy" / "functional.py").is_file():
        sys.path.insert(0, str(_root))
        break
try:
    from mha_numpy.functional import softmax_backward, softmax_forward  # noqa: F401
except Exception:  # noqa: BLE001 - the guard held: hand in something that cannot pass

    def softmax_forward(x):
        return np.zeros_like(x), None

    def softmax_backward(dp, cache):
        return np.zeros_like(dp)
