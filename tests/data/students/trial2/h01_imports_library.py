# expect: FAIL
# where: softmax_forward
# name: hostile
"""Hostile: the library's own pair handed in as the student's."""

from mha_numpy.functional import softmax_backward, softmax_forward  # noqa: F401
