"""The pairs the course checker grades, and the cases of the two checks that are not a library pair.

``PAIRS``: every pair of the registry (``mha_numpy.pairs``) that has course cases, then the course pairs whose
references live in the checker: self-attention (on ``MultiHeadAttention``) and exercise 13's
FlashAttention pair (the key-block loop, its cache holding m and 1/ℓ) in ``checker.reference``, exercise 14's gated
delta rule token by token in ``checker.delta_rule``. ``online_softmax_cases``
are the calls of the online-softmax update (exercise 7), which is a step, not a pair.
"""

from __future__ import annotations

import numpy as np

from .. import pairs
from ..pairs import Case, Pair
from . import delta_rule as DR
from . import reference as R


def self_attention_cases(rng):
    E, H = 6, 2
    params = {n: rng.standard_normal((E, E)) * 0.5 for n in ("W_q", "W_k", "W_v", "W_o")}
    params.update({n: rng.standard_normal(E) * 0.1 for n in ("b_q", "b_k", "b_v", "b_o")})
    return [
        Case(
            "x (2, 3, 6), H=2, causal mask",
            [
                ("x", rng.standard_normal((2, 3, E))),
                ("params", params),
                ("num_heads", H),
                ("mask", np.tril(np.ones((3, 3), dtype=bool))),
            ],
        )
    ]


def online_softmax_cases(rng):
    rising = np.cumsum(np.abs(rng.standard_normal((2, 3, 7))), axis=-1) * 3  # the max grows block after block
    masked = rng.standard_normal((2, 3, 7))
    masked[0, 1, :3] = -np.inf  # the first block of this row has no key allowed
    masked[1, 2, :] = -np.inf  # this row has none at all: context 0
    v = rng.standard_normal((2, 7, 4))
    return [
        Case(f"scores {s.shape}, block {b}{extra}", [("scores", s), ("v", v), ("block", b)])
        for s, extra in [(rising, ", rising scores"), (masked, ", masked blocks")]
        for b in (2, 3)
    ]


def flash_attention_cases(rng):
    """Exercise 13: Lk not a multiple of the block, scores whose max grows tile after tile, a fully masked row."""
    mask = rng.random((2, 1, 4, 5)) > 0.35
    mask[..., 0] = True
    mask[1, 0, 2, :] = False  # a query with no key allowed: zero weights, context and gradients
    return [
        Case(
            "q (2, 2, 3, 4), k, v (2, 2, 7, 4), block 3, no mask",
            [("q", 3 * rng.standard_normal((2, 2, 3, 4))), ("k", rng.standard_normal((2, 2, 7, 4)))]
            + [("v", rng.standard_normal((2, 2, 7, 4))), ("mask", None), ("block", 3)],
        ),
        Case(
            "q (2, 2, 4, 3), k (2, 2, 5, 3), v (2, 2, 5, 2), block 2, mask with a fully masked row",
            [("q", rng.standard_normal((2, 2, 4, 3))), ("k", rng.standard_normal((2, 2, 5, 3)))]
            + [("v", rng.standard_normal((2, 2, 5, 2))), ("mask", mask), ("block", 2)],
        ),
    ]


def delta_rule_cases(rng):
    """Exercise 14: an initial state given and not, dk ≠ dv and dk = dv, unit keys (as Qwen3-Next's l2norm), decays
    and write strengths away from their bounds (so central differences stay inside g ≤ 0, β in [0, 1])."""

    def inputs(B, H, L, dk, dv):
        k = rng.standard_normal((B, H, L, dk))
        k /= np.linalg.norm(k, axis=-1, keepdims=True)  # (B, H, L, dk): unit keys
        q = rng.standard_normal((B, H, L, dk))
        return [("q", q), ("k", k), ("v", rng.standard_normal((B, H, L, dv)))] + [
            ("g", -rng.uniform(0.05, 0.7, (B, H, L))),
            ("beta", rng.uniform(0.2, 0.9, (B, H, L))),
        ]

    return [
        Case(
            "q, k (2, 2, 5, 3), v (2, 2, 5, 4), an initial state",
            [*inputs(2, 2, 5, 3, 4), ("initial_state", rng.standard_normal((2, 2, 3, 4)))],
        ),
        Case("q, k (1, 2, 4, 3), v (1, 2, 4, 3), no initial state", [*inputs(1, 2, 4, 3, 3), ("initial_state", None)]),
    ]


FLASH_ATTENTION = Pair(
    "flash_attention", R.flash_attention_forward, R.flash_attention_backward, ("q", "k", "v"), flash_attention_cases
)
SELF_ATTENTION = Pair(
    "self_attention",
    R.self_attention_forward,
    R.self_attention_backward,
    ("x", "W_q", "W_k", "W_v", "W_o", "b_q", "b_k", "b_v", "b_o"),
    self_attention_cases,
)
DELTA_RULE = Pair(
    "delta_rule_recurrent",
    DR.delta_rule_recurrent_forward,
    DR.delta_rule_recurrent_backward,
    ("q", "k", "v", "g", "beta", "initial_state"),
    delta_rule_cases,
)
PAIRS: list[Pair] = [p for p in pairs.PAIRS if p.cases is not None] + [SELF_ATTENTION, FLASH_ATTENTION, DELTA_RULE]
ONLINE_SOFTMAX = "online_softmax_update"  # the one checked function that is not half of a pair


def find(name: str) -> Pair:
    """The graded pair ``name``."""
    for pair in PAIRS:
        if pair.name == name:
            return pair
    raise KeyError(name)
