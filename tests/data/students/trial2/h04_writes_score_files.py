# expect: FAIL
# where: linear_backward b
# name: hostile
"""Hostile: writes full-mark score files wherever it can guess one is read (its working directory) at import and
again from each call; the backward forgets the bias."""

import json
import os

FULL = {"score": 100, "max_score": 100, "tests": [{"name": "linear_backward", "score": 1, "max_score": 1}]}


def _forge():
    for name in ("results.json", "score.json", "grade.json"):
        try:
            with open(os.path.join(os.getcwd(), name), "w", encoding="utf-8") as f:
                json.dump(FULL, f)
        except OSError:
            pass


_forge()


def linear_forward(x, W, b):
    _forge()
    return x @ W.T + b, (x, W)


def linear_backward(dy, cache):
    _forge()
    x, W = cache
    return dy @ W, dy.reshape(-1, dy.shape[-1]).T @ x.reshape(-1, x.shape[-1]), None
