# expect: FAIL
# where: import
# name: hostile
"""Hostile: sys.exit(0) while the file is imported, after defining a wrong pair (a status 0 is not a pass)."""

import sys

import numpy as np


def softmax_forward(x):
    return np.zeros_like(x), None


sys.exit(0)
