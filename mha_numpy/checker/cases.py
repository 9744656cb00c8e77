"""Random inputs for every pair the checker knows, several shapes each.

A ``Pair`` names the functions ``NAME_forward`` / ``NAME_backward``, the forward's arguments (passed
positionally, so a student may call them what they like), which of them get a gradient, and where
the reference pair lives. The cases always include batch > 1, Lq != Lk, masks and a fully masked
row where they make sense, and one square case (Lq = Lk) so that a swapped transpose can be computed
and recognised. Everything is float64.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np


@dataclass
class Case:
    """One call: ``args`` in the forward's order, ``grads`` the names of the backward's outputs."""

    label: str
    args: list[tuple[str, object]]

    def values(self) -> list:
        return [v for _, v in self.args]

    def get(self, name: str):
        return dict(self.args)[name]


@dataclass
class Pair:
    """A forward/backward pair the checker can test; ``grads`` name the backward's outputs in order."""

    name: str
    make_cases: Callable[[np.random.Generator], list[Case]]
    grads: tuple[str, ...]
    home: str  # module holding the reference pair (looked up by name when the check runs)
    scalar_output: bool = False  # the forward returns a float (a loss): the upstream gradient is a scalar
    notes: list[str] = field(default_factory=list)


def _randn(rng, *shape):
    return rng.standard_normal(shape)


def _blocked_mask(rng, B, H, Lq, Lk, full_row: bool):
    """bool (B, 1, Lq, Lk), True = may attend: a random pattern, and optionally one fully masked row."""
    mask = rng.random((B, 1, Lq, Lk)) > 0.35
    mask[..., 0] = True  # every row keeps one key ...
    if full_row:
        mask[-1, 0, -1, :] = False  # ... except the last query of the last batch element: fully masked
    return mask


def linear_cases(rng):
    return [
        Case("x (2, 3, 4), W (5, 4)", [("x", _randn(rng, 2, 3, 4)), ("W", _randn(rng, 5, 4)), ("b", _randn(rng, 5))]),
        Case("x (2, 2, 3, 4) 4-D", [("x", _randn(rng, 2, 2, 3, 4)), ("W", _randn(rng, 3, 4)), ("b", _randn(rng, 3))]),
    ]


def split_heads_cases(rng):
    return [
        Case("x (2, 3, 6), H=2", [("x", _randn(rng, 2, 3, 6)), ("num_heads", 2)]),
        Case("x (3, 4, 12), H=3", [("x", _randn(rng, 3, 4, 12)), ("num_heads", 3)]),
    ]


def merge_heads_cases(rng):
    return [
        Case("x (2, 2, 3, 3)", [("x", _randn(rng, 2, 2, 3, 3))]),
        Case("x (3, 3, 4, 2)", [("x", _randn(rng, 3, 3, 4, 2))]),
    ]


def attention_scores_cases(rng):
    return [
        Case(
            "q (2, 2, 3, 4), k (2, 2, 5, 4)",
            [("q", _randn(rng, 2, 2, 3, 4)), ("k", _randn(rng, 2, 2, 5, 4)), ("scale", 0.5)],
        ),
        Case(
            "q (2, 3, 4, 2), k (2, 3, 4, 2) Lq = Lk",
            [("q", _randn(rng, 2, 3, 4, 2)), ("k", _randn(rng, 2, 3, 4, 2)), ("scale", 0.7)],
        ),
    ]


def apply_mask_cases(rng):
    return [
        Case(
            "scores (2, 2, 3, 5), bool mask",
            [("scores", _randn(rng, 2, 2, 3, 5)), ("mask", _blocked_mask(rng, 2, 2, 3, 5, False))],
        ),
        Case(
            "scores (2, 2, 4, 4), float mask", [("scores", _randn(rng, 2, 2, 4, 4)), ("mask", _randn(rng, 2, 1, 4, 4))]
        ),
    ]


def softmax_cases(rng):
    x = _randn(rng, 2, 2, 3, 5) * 2
    x[1, 1, 2, :] = -np.inf  # a fully masked row: weights 0, never NaN
    x[0, 0, 1, 3] = -np.inf  # one blocked key
    return [
        Case("x (2, 2, 3, 5)", [("x", _randn(rng, 2, 2, 3, 5) * 2)]),
        Case("x (2, 2, 3, 5) with -inf and a fully masked row", [("x", x)]),
    ]


def dropout_cases(rng):
    x = _randn(rng, 2, 2, 3, 4)
    return [
        Case("x (2, 2, 3, 4), p=0.3", [("x", x), ("p", 0.3), ("rng", None), ("keep_mask", rng.random(x.shape) >= 0.3)]),
        Case(
            "x (2, 2, 3, 4), p=0.5",
            [("x", x.copy()), ("p", 0.5), ("rng", None), ("keep_mask", rng.random(x.shape) >= 0.5)],
        ),
    ]


def attention_context_cases(rng):
    return [Case("p (2, 2, 3, 5), v (2, 2, 5, 4)", [("p", _randn(rng, 2, 2, 3, 5)), ("v", _randn(rng, 2, 2, 5, 4))])]


def sdpa_cases(rng):
    def qkv(B, H, Lq, Lk, d):
        return [("q", _randn(rng, B, H, Lq, d)), ("k", _randn(rng, B, H, Lk, d)), ("v", _randn(rng, B, H, Lk, d))]

    return [
        Case("q (2, 2, 3, 4), k, v (2, 2, 5, 4), no mask", qkv(2, 2, 3, 5, 4) + [("mask", None)]),
        Case(
            "q (2, 2, 4, 3), k, v (2, 2, 4, 3), mask with a fully masked row",
            qkv(2, 2, 4, 4, 3) + [("mask", _blocked_mask(rng, 2, 2, 4, 4, True))],
        ),
    ]


def embedding_cases(rng):
    return [
        Case(
            "ids (2, 5) with repeats, table (4, 3)",
            [("ids", np.array([[0, 1, 1, 3, 1], [3, 3, 0, 2, 1]])), ("table", _randn(rng, 4, 3))],
        )
    ]


def softmax_cross_entropy_cases(rng):
    return [Case("logits (2, 3, 5)", [("logits", _randn(rng, 2, 3, 5)), ("targets", rng.integers(0, 5, (2, 3)))])]


def layer_norm_cases(rng):
    return [
        Case(
            "x (2, 3, 6), eps=1e-5",
            [("x", _randn(rng, 2, 3, 6)), ("gamma", _randn(rng, 6)), ("beta", _randn(rng, 6)), ("eps", 1e-5)],
        )
    ]


def self_attention_cases(rng):
    E, H = 6, 2
    params = {n: _randn(rng, E, E) * 0.5 for n in ("W_q", "W_k", "W_v", "W_o")}
    params.update({n: _randn(rng, E) * 0.1 for n in ("b_q", "b_k", "b_v", "b_o")})
    return [
        Case(
            "x (2, 3, 6), H=2, causal mask",
            [
                ("x", _randn(rng, 2, 3, E)),
                ("params", params),
                ("num_heads", H),
                ("mask", np.tril(np.ones((3, 3), dtype=bool))),
            ],
        )
    ]


F = "mha_numpy.functional"
LAYERS = "mha_numpy.models.layers"
REF = "mha_numpy.checker.reference"

PAIRS = [
    Pair("linear", linear_cases, ("x", "W", "b"), F),
    Pair("split_heads", split_heads_cases, ("x",), F),
    Pair("merge_heads", merge_heads_cases, ("x",), F),
    Pair("attention_scores", attention_scores_cases, ("q", "k"), F),
    Pair("apply_mask", apply_mask_cases, ("scores",), F),
    Pair("softmax", softmax_cases, ("x",), F),
    Pair("dropout", dropout_cases, ("x",), F),
    Pair("attention_context", attention_context_cases, ("p", "v"), F),
    Pair("scaled_dot_product_attention", sdpa_cases, ("q", "k", "v"), F),
    Pair("embedding", embedding_cases, ("table",), LAYERS),
    Pair("softmax_cross_entropy", softmax_cross_entropy_cases, ("logits",), LAYERS, scalar_output=True),
    Pair("layer_norm", layer_norm_cases, ("x", "gamma", "beta"), LAYERS),
    Pair("self_attention", self_attention_cases, ("x", "W_q", "W_k", "W_v", "W_o", "b_q", "b_k", "b_v", "b_o"), REF),
]
