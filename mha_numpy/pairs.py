"""Every forward/backward pair that is checked, listed once: its functions, its differentiable inputs, its cases.

``gradcheck.check_functional`` compares each pair's backward with central differences on one random case at the
sizes it is given (``Pair.sample``); the course checker (``mha_numpy.checker``) compares a student's
``NAME_forward`` / ``NAME_backward`` with the pair on several fixed cases (``Pair.cases``: batch > 1, Lq != Lk,
masks, a fully masked row, one square case so that a swapped transpose can be computed and recognised).

A case lists the forward's arguments in the forward's order, each with its name (the forward is always called
positionally, so a student may name the arguments as they like). ``grads`` names the differentiable inputs in
the forward's order; the backward returns one gradient per differentiable input, None for an optional input
that was not given (docs/architecture.md, "Backward return convention"); ``gradients`` reads a backward's
result that way. Adding a pair is one ``Pair(...)`` entry in ``PAIRS`` and the functions that make its cases.
Everything is float64.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from . import functional as F
from .models import layers as LY
from .recurrent import conv as CV
from .recurrent import gates as GT
from .recurrent import norms as NM


@dataclass
class Case:
    """One call of a forward: ``args`` (name, value) in the forward's order; ``label`` says what it is."""

    label: str
    args: list[tuple[str, object]]

    def values(self) -> list:
        """The argument values in the forward's order, ready for ``forward(*case.values())``."""
        return [v for _, v in self.args]

    def get(self, name: str):
        """The argument ``name``'s value (KeyError when the case has no such argument)."""
        return dict(self.args)[name]

    def array(self, name: str):
        """The argument ``name``, or the entry ``name`` of a dict argument (self-attention's params)."""
        for arg_name, value in self.args:
            if arg_name == name:
                return value
            if isinstance(value, dict) and name in value:
                return value[name]
        raise KeyError(name)

    def gives(self, name: str) -> bool:
        """True when the case passes ``name`` (not None): the backward owes it a gradient."""
        try:
            return self.array(name) is not None
        except KeyError:
            return False


@dataclass(frozen=True)
class Sizes:
    """The sizes ``check_functional`` is given: B, H, Lq, Lk, d (E = H·d), the attention's mask and dropout."""

    B: int = 2
    H: int = 2
    Lq: int = 3
    Lk: int = 4
    d: int = 3
    mask: np.ndarray | None = None
    dropout_p: float = 0.0

    @property
    def E(self) -> int:
        """The embedding width E = H·d."""
        return self.H * self.d


@dataclass(frozen=True)
class Pair:
    """``NAME_forward(*case) -> (out, cache)`` / ``NAME_backward(d_out, cache)``, with how to make random cases.

    grads: the differentiable inputs, in the forward's order (the order of the backward's gradients).
    cases(rng) -> the course checker's cases, or None: the course does not grade this pair.
    sample(sizes, rng) -> check_functional's cases, each labelled with its rows' prefix, or None: not in it.
    scalar_output: the forward returns a float (a loss), so the upstream gradient is a scalar.
    """

    name: str
    forward: Callable
    backward: Callable
    grads: tuple[str, ...]
    cases: Callable[[np.random.Generator], list[Case]] | None = None
    sample: Callable[[Sizes, np.random.Generator], list[Case]] | None = None
    scalar_output: bool = False

    def owed(self, case: Case) -> list[str]:
        """The differentiable inputs ``case`` passes, in order: the gradients the backward owes on it."""
        return [n for n in self.grads if case.gives(n)]


class ReturnConventionError(ValueError):
    """A backward returned a different number of gradients than its forward has differentiable inputs."""


def gradients(pair: Pair, result, case: Case) -> dict:
    """A backward's ``result`` as {input name: gradient} for the differentiable inputs ``case`` gives.

    Accepted: one gradient per input the case gives, in the forward's order (a single array when there is one);
    or one per entry of ``pair.grads`` with None for those the case does not give (the library's
    ``scaled_dot_product_attention_backward`` without a bias); or a dict by name (self-attention).
    Anything else raises ReturnConventionError, with one line saying what was expected.
    """
    given = pair.owed(case)
    if isinstance(result, dict):
        return {n: result.get(n) for n in given}
    result = list(result) if isinstance(result, tuple | list) else [result]
    if len(result) == len(pair.grads) != len(given):
        extra = [n for n, g in zip(pair.grads, result) if n not in given and g is not None]
        if not extra:
            return {n: g for n, g in zip(pair.grads, result) if n in given}
    if len(result) != len(given):
        names = ", ".join(f"d{n}" for n in given)
        return_error = f"returned {len(result)} gradient{'s' * (len(result) != 1)}, expected {len(given)} ({names})"
        raise ReturnConventionError(f"{return_error}: one per differentiable input, in the forward's order")
    return dict(zip(given, result))


def _randn(rng, *shape):
    return rng.standard_normal(shape)


def _blocked_mask(rng, B, H, Lq, Lk, full_row: bool):
    """bool (B, 1, Lq, Lk), True = may attend: a random pattern, and optionally one fully masked row."""
    mask = rng.random((B, 1, Lq, Lk)) > 0.35
    mask[..., 0] = True  # every row keeps one key ...
    if full_row:
        mask[-1, 0, -1, :] = False  # ... except the last query of the last batch element: fully masked
    return mask


# --------------------------------------------------------------------------- the course checker's cases


def linear_cases(rng):
    """The checker's cases of ``linear``: x (2, 3, 4) with W (5, 4), b (5,); a 4-D x (2, 2, 3, 4) with W (3, 4)."""
    return [
        Case("x (2, 3, 4), W (5, 4)", [("x", _randn(rng, 2, 3, 4)), ("W", _randn(rng, 5, 4)), ("b", _randn(rng, 5))]),
        Case("x (2, 2, 3, 4) 4-D", [("x", _randn(rng, 2, 2, 3, 4)), ("W", _randn(rng, 3, 4)), ("b", _randn(rng, 3))]),
    ]


def split_heads_cases(rng):
    """The checker's cases of ``split_heads``: x (2, 3, 6) into 2 heads, x (3, 4, 12) into 3."""
    return [
        Case("x (2, 3, 6), H=2", [("x", _randn(rng, 2, 3, 6)), ("num_heads", 2)]),
        Case("x (3, 4, 12), H=3", [("x", _randn(rng, 3, 4, 12)), ("num_heads", 3)]),
    ]


def merge_heads_cases(rng):
    """The checker's cases of ``merge_heads``: x (2, 2, 3, 3) and (3, 3, 4, 2), (B, H, L, d) each."""
    return [
        Case("x (2, 2, 3, 3)", [("x", _randn(rng, 2, 2, 3, 3))]),
        Case("x (3, 3, 4, 2)", [("x", _randn(rng, 3, 3, 4, 2))]),
    ]


def attention_scores_cases(rng):
    """The checker's cases of ``attention_scores``: q (2, 2, 3, 4) with k (2, 2, 5, 4), and Lq = Lk."""
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
    """The checker's cases of ``apply_mask``: scores (2, 2, 3, 5) with a bool mask, (2, 2, 4, 4) with a float one."""
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
    """The checker's cases of ``softmax``: x (2, 2, 3, 5), and one with a blocked key and a fully masked row."""
    x = _randn(rng, 2, 2, 3, 5) * 2
    x[1, 1, 2, :] = -np.inf  # a fully masked row: weights 0, never NaN
    x[0, 0, 1, 3] = -np.inf  # one blocked key
    return [
        Case("x (2, 2, 3, 5)", [("x", _randn(rng, 2, 2, 3, 5) * 2)]),
        Case("x (2, 2, 3, 5) with -inf and a fully masked row", [("x", x)]),
    ]


def dropout_cases(rng):
    """The checker's cases of ``dropout``: x (2, 2, 3, 4) at p = 0.3 and 0.5, each with its keep-mask given."""
    x = _randn(rng, 2, 2, 3, 4)
    return [
        Case("x (2, 2, 3, 4), p=0.3", [("x", x), ("p", 0.3), ("rng", None), ("keep_mask", rng.random(x.shape) >= 0.3)]),
        Case(
            "x (2, 2, 3, 4), p=0.5",
            [("x", x.copy()), ("p", 0.5), ("rng", None), ("keep_mask", rng.random(x.shape) >= 0.5)],
        ),
    ]


def attention_context_cases(rng):
    """The checker's case of ``attention_context``: p (2, 2, 3, 5), v (2, 2, 5, 4)."""
    return [Case("p (2, 2, 3, 5), v (2, 2, 5, 4)", [("p", _randn(rng, 2, 2, 3, 5)), ("v", _randn(rng, 2, 2, 5, 4))])]


def sdpa_cases(rng):
    """(q, k, v, mask): the signature of exercise 6's attention, without a bias (so dq, dk, dv are owed)."""

    def qkv(B, H, Lq, Lk, d):
        return [("q", _randn(rng, B, H, Lq, d)), ("k", _randn(rng, B, H, Lk, d)), ("v", _randn(rng, B, H, Lk, d))]

    return [
        Case("q (2, 2, 3, 4), k, v (2, 2, 5, 4), no mask", qkv(2, 2, 3, 5, 4) + [("mask", None)]),
        Case(  # three heads: a factor of the heads is not one of the batch (2) there
            "q (2, 3, 4, 3), k, v (2, 3, 4, 3), mask with a fully masked row",
            qkv(2, 3, 4, 4, 3) + [("mask", _blocked_mask(rng, 2, 3, 4, 4, True))],
        ),
    ]


def embedding_cases(rng):
    """The checker's case of ``embedding``: ids (2, 5) with repeated ids into a table (4, 3)."""
    return [
        Case(
            "ids (2, 5) with repeats, table (4, 3)",
            [("ids", np.array([[0, 1, 1, 3, 1], [3, 3, 0, 2, 1]])), ("table", _randn(rng, 4, 3))],
        )
    ]


def softmax_cross_entropy_cases(rng):
    """The checker's case of ``softmax_cross_entropy``: logits (2, 3, 5), targets (2, 3) in 0..4."""
    return [Case("logits (2, 3, 5)", [("logits", _randn(rng, 2, 3, 5)), ("targets", rng.integers(0, 5, (2, 3)))])]


def layer_norm_cases(rng):
    """The checker's case of ``layer_norm``: x (2, 3, 6), gamma and beta (6,), eps 1e-5."""
    return [
        Case(
            "x (2, 3, 6), eps=1e-5",
            [("x", _randn(rng, 2, 3, 6)), ("gamma", _randn(rng, 6)), ("beta", _randn(rng, 6)), ("eps", 1e-5)],
        )
    ]


def repeat_kv_cases(rng):
    """The checker's cases of ``repeat_kv``: x (2, 2, 3, 4) repeated 3 times, x (1, 3, 2, 2) twice."""
    return [
        Case("x (2, 2, 3, 4), n_rep=3", [("x", _randn(rng, 2, 2, 3, 4)), ("n_rep", 3)]),
        Case("x (1, 3, 2, 2), n_rep=2", [("x", _randn(rng, 1, 3, 2, 2)), ("n_rep", 2)]),
    ]


def rope_cases(rng):
    """The checker's cases of ``rope``: x (2, 2, 5, 4) at positions 0.., x (2, 3, 3, 6) at given positions (2, 3)."""
    decoding = np.array([[5, 6, 7], [0, 1, 2]])  # (B, L): each sequence at its own offset (a KV cache)
    return [
        Case("x (2, 2, 5, 4), positions None", [("x", _randn(rng, 2, 2, 5, 4)), ("positions", None), ("theta", 100.0)]),
        Case(
            "x (2, 3, 3, 6), positions (2, 3)",
            [("x", _randn(rng, 2, 3, 3, 6)), ("positions", decoding), ("theta", 10.0)],
        ),
    ]


def relative_position_bias_cases(rng):
    """The checker's cases of ``relative_position_bias``: table (2, 5) with clipped distances, table (3, 3)."""
    return [
        Case("table (2, 5), Lq=4, Lk=6 (distances clipped)", [("table", _randn(rng, 2, 5)), ("Lq", 4), ("Lk", 6)]),
        Case("table (3, 3), Lq=5, Lk=3", [("table", _randn(rng, 3, 3)), ("Lq", 5), ("Lk", 3)]),
    ]


def soft_cap_cases(rng):
    """The checker's cases of ``soft_cap``: scores (2, 2, 3, 5) capped at 2, scores (1, 3, 4, 4) at 0.5."""
    return [
        Case("scores (2, 2, 3, 5), cap=2", [("scores", 3 * _randn(rng, 2, 2, 3, 5)), ("cap", 2.0)]),
        Case("scores (1, 3, 4, 4), cap=0.5", [("scores", _randn(rng, 1, 3, 4, 4)), ("cap", 0.5)]),
    ]


def sink_softmax_cases(rng):
    """The checker's cases of ``sink_softmax``: x (2, 2, 3, 5) with a fully masked row, sink (2, 1); x (1, 3, 4, 2)."""
    x = 2 * _randn(rng, 2, 2, 3, 5)
    x[1, 0, 2, :] = -np.inf  # a fully masked row: its whole weight on the sink
    x[0, 1, 0, 1] = -np.inf  # one blocked key
    return [
        Case("x (2, 2, 3, 5) with a fully masked row, sink (2, 1)", [("x", x), ("sink", _randn(rng, 2, 1))]),
        Case("x (1, 3, 4, 2), sink (3, 1)", [("x", _randn(rng, 1, 3, 4, 2)), ("sink", 1.5 + _randn(rng, 3, 1))]),
    ]


# --------------------------------------------------------------------------- check_functional's cases


def linear_sample(s: Sizes, rng):
    """check_functional's case of ``linear``: x (B, Lq, E), W (5, E), b (5,)."""
    return [Case("linear", [("x", _randn(rng, s.B, s.Lq, s.E)), ("W", _randn(rng, 5, s.E)), ("b", _randn(rng, 5))])]


def split_heads_sample(s: Sizes, rng):
    """check_functional's case of ``split_heads``: x (B, Lq, E) into H heads."""
    return [Case("split", [("x", _randn(rng, s.B, s.Lq, s.E)), ("num_heads", s.H)])]


def merge_heads_sample(s: Sizes, rng):
    """check_functional's case of ``merge_heads``: x (B, H, Lq, d)."""
    return [Case("merge", [("x", _randn(rng, s.B, s.H, s.Lq, s.d))])]


def attention_scores_sample(s: Sizes, rng):
    """check_functional's case of ``attention_scores``: q (B, H, Lq, d), k (B, H, Lk, d), scale 0.7."""
    q, k = _randn(rng, s.B, s.H, s.Lq, s.d), _randn(rng, s.B, s.H, s.Lk, s.d)
    return [Case("scores", [("q", q), ("k", k), ("scale", 0.7)])]


def apply_mask_sample(s: Sizes, rng):
    """check_functional's case of ``apply_mask``: scores and an additive mask, (B, H, Lq, Lk) each."""
    mask = _randn(rng, s.B, s.H, s.Lq, s.Lk)  # additive: the scores' gradient is the identity
    return [Case("mask", [("scores", _randn(rng, s.B, s.H, s.Lq, s.Lk)), ("mask", mask)])]


def softmax_sample(s: Sizes, rng):
    """check_functional's case of ``softmax``: x (B, H, Lq, Lk)."""
    return [Case("softmax", [("x", _randn(rng, s.B, s.H, s.Lq, s.Lk))])]


def dropout_sample(s: Sizes, rng):
    """check_functional's case of ``dropout``: x (B, H, Lq, Lk), p = 0.3 with its keep-mask given."""
    keep = rng.random((s.B, s.H, s.Lq, s.Lk)) >= 0.3
    return [Case("dropout", [("x", _randn(rng, s.B, s.H, s.Lq, s.Lk)), ("p", 0.3), ("rng", None), ("keep_mask", keep)])]


def attention_context_sample(s: Sizes, rng):
    """check_functional's case of ``attention_context``: p (B, H, Lq, Lk), v (B, H, Lk, d)."""
    return [Case("context", [("p", _randn(rng, s.B, s.H, s.Lq, s.Lk)), ("v", _randn(rng, s.B, s.H, s.Lk, s.d))])]


def repeat_kv_sample(s: Sizes, rng):
    """check_functional's case of ``repeat_kv``: x (B, 1, Lk, d) repeated H times."""
    return [Case("repeat_kv", [("x", _randn(rng, s.B, 1, s.Lk, s.d)), ("n_rep", s.H)])]


def rope_sample(s: Sizes, rng):
    """check_functional's case of ``rope``: x (B, H, Lq, 2d) at positions 0.., theta 100."""
    return [Case("rope", [("x", _randn(rng, s.B, s.H, s.Lq, 2 * s.d)), ("positions", None), ("theta", 100.0)])]


def rope_interleaved_sample(s: Sizes, rng):
    """check_functional's case of ``rope_interleaved``: x (B, H, Lq, 2d) at positions 0.., theta 100."""
    x = _randn(rng, s.B, s.H, s.Lq, 2 * s.d)
    return [Case("rope_interleaved", [("x", x), ("positions", None), ("theta", 100.0)])]


def rotary_sample(s: Sizes, rng):
    """check_functional's cases of ``rotary``: x (B, H, Lq, 2d + 1), d pairs turned by a scaled table (the last
    feature passed through), half-split and interleaved."""
    x, inv_freq = _randn(rng, s.B, s.H, s.Lq, 2 * s.d + 1), 1.0 / 50.0 ** (np.arange(s.d) / s.d) / 3.0
    return [Case(label, [("x", x), ("positions", None), ("inv_freq", inv_freq), ("attention_factor", 1.3),
                         ("interleaved", interleaved)]) for label, interleaved in (("rotary", False),
                                                                                   ("rotary_pairs", True))]  # fmt: skip


def concat_features_sample(s: Sizes, rng):
    """MLA's key: each head's part next to one part shared by every head (broadcast over H)."""
    return [Case("concat_features", [("a", _randn(rng, s.B, s.H, s.Lk, s.d)), ("b", _randn(rng, s.B, 1, s.Lk, 2))])]


def sdpa_sample(s: Sizes, rng):
    """q, k, v, the given mask, dropout with a fixed keep-mask; no bias (its gradient is None)."""
    keep = rng.random((s.B, s.H, s.Lq, s.Lk)) >= s.dropout_p if s.dropout_p > 0 else None
    q, k, v = _randn(rng, s.B, s.H, s.Lq, s.d), _randn(rng, s.B, s.H, s.Lk, s.d), _randn(rng, s.B, s.H, s.Lk, s.d)
    settings = [("mask", s.mask), ("scale", None), ("dropout_p", s.dropout_p), ("rng", None), ("dropout_mask", keep)]
    return [Case("sdpa", [("q", q), ("k", k), ("v", v), *settings])]


def add_sample(s: Sizes, rng):
    """check_functional's case of ``add``: a and b (B, Lq, E)."""
    return [Case("add", [("a", _randn(rng, s.B, s.Lq, s.E)), ("b", _randn(rng, s.B, s.Lq, s.E))])]


def _ids(s: Sizes, rng, vocab: int = 7):
    ids = rng.integers(0, vocab, (s.B, s.Lq))
    ids[0, :2] = 3  # a repeated id: its gradient rows must accumulate
    return ids


def embedding_sample(s: Sizes, rng):
    """check_functional's case of ``embedding``: ids (B, Lq) with a repeated id into a table (7, E)."""
    return [Case("embedding", [("ids", _ids(s, rng)), ("table", _randn(rng, 7, s.E))])]


def bert_embeddings_sample(s: Sizes, rng):
    """check_functional's case of ``bert_embeddings``: ids and token types (B, Lq), word (7, E), position (Lq + 2, E)
    and token-type (2, E) tables.
    """
    ids, types = _ids(s, rng), rng.integers(0, 2, (s.B, s.Lq))
    word, position, token_type = _randn(rng, 7, s.E), _randn(rng, s.Lq + 2, s.E), _randn(rng, 2, s.E)
    tables = [("word", word), ("position", position), ("token_type", token_type)]
    return [Case("bert_embeddings", [("input_ids", ids), ("token_type_ids", types), *tables])]


def layer_norm_sample(s: Sizes, rng):
    """check_functional's case of ``layer_norm``: x (B, Lq, E), gamma and beta (E,), eps 1e-5."""
    x, gamma, beta = _randn(rng, s.B, s.Lq, s.E), _randn(rng, s.E), _randn(rng, s.E)
    return [Case("layer_norm", [("x", x), ("gamma", gamma), ("beta", beta), ("eps", 1e-5)])]


def gelu_sample(s: Sizes, rng):
    """check_functional's cases of ``gelu``: x (B, Lq, 2E + 1), exact and tanh."""
    I = 2 * s.E + 1  # noqa: E741 - the FFN's inner width, as in the docs
    return [
        Case(label, [("x", 3 * _randn(rng, s.B, s.Lq, I)), ("approximate", approximate)])
        for label, approximate in [("gelu", "none"), ("gelu_tanh", "tanh")]
    ]


def feed_forward_sample(s: Sizes, rng):
    """check_functional's case of ``feed_forward``: x (B, Lq, E), W1 (I, E), b1 (I,), W2 (E, I), b2 (E,), I = 2E + 1."""
    E, I = s.E, 2 * s.E + 1  # noqa: E741
    weights = [("W1", _randn(rng, I, E)), ("b1", _randn(rng, I)), ("W2", _randn(rng, E, I)), ("b2", _randn(rng, E))]
    return [Case("feed_forward", [("x", _randn(rng, s.B, s.Lq, E)), *weights])]


def rms_norm_sample(s: Sizes, rng):
    """check_functional's case of ``rms_norm``: x (B, Lq, E), weight (E,), eps 1e-5."""
    return [Case("rms_norm", [("x", _randn(rng, s.B, s.Lq, s.E)), ("weight", _randn(rng, s.E)), ("eps", 1e-5)])]


def silu_sample(s: Sizes, rng):
    """check_functional's case of ``silu``: x (B, Lq, 2E + 1)."""
    return [Case("silu", [("x", 3 * _randn(rng, s.B, s.Lq, 2 * s.E + 1))])]


def swiglu_sample(s: Sizes, rng):
    """check_functional's case of ``swiglu``: x (B, Lq, E), W_gate and W_up (I, E), W_down (E, I), I = 2E + 1."""
    E, I = s.E, 2 * s.E + 1  # noqa: E741
    weights = [("W_gate", _randn(rng, I, E)), ("W_up", _randn(rng, I, E)), ("W_down", _randn(rng, E, I))]
    return [Case("swiglu", [("x", _randn(rng, s.B, s.Lq, E)), *weights])]


def soft_cap_sample(s: Sizes, rng):
    """check_functional's case of ``soft_cap``: scores (B, H, Lq, Lk) capped at 1.5."""
    return [Case("soft_cap", [("scores", 2 * _randn(rng, s.B, s.H, s.Lq, s.Lk)), ("cap", 1.5)])]


def sink_softmax_sample(s: Sizes, rng):
    """check_functional's case of ``sink_softmax``: x (B, H, Lq, Lk) with a fully masked row, sink (H, 1)."""
    x = _randn(rng, s.B, s.H, s.Lq, s.Lk)
    x[0, 0, 0] = -np.inf  # a fully masked row: all its weight on the sink, its gradients 0
    return [Case("sink_softmax", [("x", x), ("sink", _randn(rng, s.H, 1))])]


def diff_values_sample(s: Sizes, rng):
    """check_functional's case of ``diff_values``: v (B, 2H, Lk, d)."""
    return [Case("diff_values", [("v", _randn(rng, s.B, 2 * s.H, s.Lk, s.d))])]


def diff_lambda_sample(s: Sizes, rng):
    """check_functional's case of ``diff_lambda``: the four λ vectors (d,), lambda_init 0.47."""
    vectors = [(name, 0.5 * _randn(rng, s.d)) for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2")]
    return [Case("diff_lambda", [*vectors, ("lambda_init", 0.47)])]


def diff_combine_sample(s: Sizes, rng):
    """check_functional's case of ``diff_combine``: context (B, 2H, Lq, 2d), λ a 0-d array, lambda_init 0.47."""
    context, lam = _randn(rng, s.B, 2 * s.H, s.Lq, 2 * s.d), np.array(0.6)  # lam: a 0-d array, so it can be perturbed
    return [Case("diff_combine", [("context", context), ("lam", lam), ("lambda_init", 0.47), ("eps", 1e-5)])]


def partial_rope_sample(s: Sizes, rng):
    """check_functional's case of ``partial_rope``: x (B, H, Lq, 2d + 1), its first 2 features turned, theta 100."""
    x = _randn(rng, s.B, s.H, s.Lq, 2 * s.d + 1)
    return [Case("partial_rope", [("x", x), ("positions", None), ("theta", 100.0), ("rotary_dim", 2)])]


def gate_query_sample(s: Sizes, rng):
    """check_functional's case of ``gate_query``: x (B, H, Lq, 2d)."""
    return [Case("gate_query", [("x", _randn(rng, s.B, s.H, s.Lq, 2 * s.d))])]


def output_gate_sample(s: Sizes, rng):
    """check_functional's case of ``output_gate``: x (B, H, Lq, d), q (B, Lq, 2·H·d) with gates of both signs."""
    return [Case("output_gate", [("x", _randn(rng, s.B, s.H, s.Lq, s.d)), ("q", 2 * _randn(rng, s.B, s.Lq, 2 * s.E))])]


def merge_attention_sample(s: Sizes, rng):
    """Three partials over disjoint key sets, one of them empty for a row (lse -inf, context 0): stacked arrays
    (S, B, H, Lq, ·), so that each entry can be perturbed. No row is empty for all (its lse -inf has no
    finite difference; tests/test_merge.py checks it)."""
    contexts, lses = _randn(rng, 3, s.B, s.H, s.Lq, s.d), 2 * _randn(rng, 3, s.B, s.H, s.Lq)
    contexts[1, 0, 0, 0], lses[1, 0, 0, 0] = 0.0, -np.inf  # partial 1 has no key for this row: weight 0
    return [Case("merge_attention", [("contexts", contexts), ("lses", lses)])]


def mean_pool_sample(s: Sizes, rng):
    """check_functional's case of ``mean_pool``: x (B, Lq, E), attention_mask (B, Lq) with padding in the last row."""
    keep = np.ones((s.B, s.Lq), np.int64)
    keep[-1, s.Lq // 2 :] = 0  # padding in the last sequence
    return [Case("mean_pool", [("x", _randn(rng, s.B, s.Lq, s.E)), ("attention_mask", keep)])]


# --------------------------------------------------------------------------- the registry


def score_term_pair(mod: Callable, vjp: Callable, args: tuple[str, ...] = (), params=(), **constants) -> tuple:
    """A score term's pair (``functional.NAME_score`` / ``NAME_score_vjp``, the kernels' hook) in the pairs' form, on a
    whole (B, H, Lq, Lk) block: ``forward(scores, *args) -> (out, cache)``, ``backward(d_out, cache) -> (d_scores,
    *d_params)`` for the learned ``params`` among ``args``; ``constants`` are bound (the queries' offset)."""

    def forward(scores, *values):
        kw = dict(zip(args, values), **constants)
        index = F.score_index(scores.shape)  # (b, h, q_idx, kv_idx) of every entry
        return mod(scores, *index, **kw), (scores, index, kw)  # F1

    def backward(d_out, cache):
        scores, index, kw = cache
        d_scores, d_params = vjp(scores, *index, d_out, **kw)  # ← F1
        return (d_scores, *(d_params[n] for n in params)) if params else d_scores

    return forward, backward


def head_temperature_sample(s: Sizes, rng):
    """check_functional's case of the head temperature: scores (B, H, Lq, Lk), a temperature per head."""
    scores, t = _randn(rng, s.B, s.H, s.Lq, s.Lk), 0.5 * _randn(rng, s.H)
    return [Case("head_temperature", [("scores", scores), ("head_temperature", t)])]


def relative_position_sample(s: Sizes, rng):
    """check_functional's case of the relative-position term: a table (H, 2R + 1), R = 2, the last key appended."""
    scores, table = _randn(rng, s.B, s.H, s.Lq, s.Lk), _randn(rng, s.H, 5)
    return [Case("relative_position", [("scores", scores), ("rel_bias", table), ("keys", s.Lk - 1)])]


def alibi_sample(s: Sizes, rng):
    """check_functional's case of ALiBi as a term: scores (B, H, Lq, Lk) after one cached key (offset 1)."""
    scores = _randn(rng, s.B, s.H, s.Lq, s.Lk)
    return [Case("alibi", [("scores", scores), ("slopes", F.alibi_slopes(s.H)), ("keys", s.Lk)])]


def causal_conv1d_sample(s: Sizes, rng):
    """check_functional's case of the delta-rule layers' ``causal_conv1d`` (recurrent.conv): x (B, Lq, E), K = 3
    taps, a bias, an initial state; two outputs (y, the state after the call)."""
    C, K = s.E, 3
    args = [("x", _randn(rng, s.B, s.Lq, C)), ("weight", _randn(rng, C, K)), ("bias", _randn(rng, C)),
            ("initial_state", _randn(rng, s.B, K - 1, C))]  # fmt: skip
    return [Case("causal_conv1d", args)]


def gated_rms_norm_sample(s: Sizes, rng):
    """check_functional's cases of ``gated_rms_norm`` (recurrent.norms): x, z (B, Lq, H, d), weight (d,); the silu
    gate (Qwen3-Next) and the sigmoid gate (Kimi)."""
    x, z, w = _randn(rng, s.B, s.Lq, s.H, s.d), _randn(rng, s.B, s.Lq, s.H, s.d), 1 + 0.3 * _randn(rng, s.d)
    return [Case(f"gated_rms_norm_{act}", [("x", x), ("z", z), ("weight", w), ("eps", 1e-6), ("activation", act)])
            for act in ("silu", "sigmoid")]  # fmt: skip


def decay_sample(s: Sizes, rng):
    """check_functional's cases of the delta rule's ``decay`` gate (recurrent.gates): a (B, Lq, H) with A_log,
    dt_bias (H,) (Qwen3-Next), and a (B, Lq, H, d) with dt_bias (H, d) (Kimi's per-channel gate)."""
    return [Case(f"decay_{label}", [("a", 2 * _randn(rng, s.B, s.Lq, *tail)), ("A_log", _randn(rng, s.H)),
                                    ("dt_bias", _randn(rng, *tail))])
            for label, tail in (("per_head", (s.H,)), ("per_channel", (s.H, s.d)))]  # fmt: skip


def sigmoid_sample(s: Sizes, rng):
    """check_functional's case of ``sigmoid`` (recurrent.gates, the write strength β): x (B, Lq, H)."""
    return [Case("sigmoid", [("x", 3 * _randn(rng, s.B, s.Lq, s.H))])]


def softplus_sample(s: Sizes, rng):
    """check_functional's case of ``softplus`` (recurrent.gates): u (B, Lq, H), large entries of both signs too."""
    u = 3 * _randn(rng, s.B, s.Lq, s.H)
    u[0, 0, :2] = (-30.0, 30.0)[: min(2, s.H)]
    return [Case("softplus", [("u", u)])]


def log_length_scale_sample(s: Sizes, rng):
    """check_functional's case of Llama 4's attention temperature: scores (B, H, Lq, Lk) after two cached
    positions, scale 0.7, floor 2 (gains 1 + 0.7 · log(⌊(p + 1) / 2⌋ + 1) that differ from row to row)."""
    scores = _randn(rng, s.B, s.H, s.Lq, s.Lk)
    return [Case("log_length_scale", [("scores", scores), ("attn_scale", 0.7), ("floor_scale", 2.0)])]


PAIRS: list[Pair] = [
    Pair("linear", F.linear_forward, F.linear_backward, ("x", "W", "b"), linear_cases, linear_sample),
    Pair("split_heads", F.split_heads_forward, F.split_heads_backward, ("x",), split_heads_cases, split_heads_sample),
    Pair("merge_heads", F.merge_heads_forward, F.merge_heads_backward, ("x",), merge_heads_cases, merge_heads_sample),
    Pair(
        "attention_scores",
        F.attention_scores_forward,
        F.attention_scores_backward,
        ("q", "k"),
        attention_scores_cases,
        attention_scores_sample,
    ),
    Pair("apply_mask", F.apply_mask_forward, F.apply_mask_backward, ("scores",), apply_mask_cases, apply_mask_sample),
    Pair("softmax", F.softmax_forward, F.softmax_backward, ("x",), softmax_cases, softmax_sample),
    Pair("dropout", F.dropout_forward, F.dropout_backward, ("x",), dropout_cases, dropout_sample),
    Pair(
        "attention_context",
        F.attention_context_forward,
        F.attention_context_backward,
        ("p", "v"),
        attention_context_cases,
        attention_context_sample,
    ),
    Pair("repeat_kv", F.repeat_kv_forward, F.repeat_kv_backward, ("x",), repeat_kv_cases, repeat_kv_sample),
    Pair("rope", F.rope_forward, F.rope_backward, ("x",), rope_cases, rope_sample),
    Pair(
        "scaled_dot_product_attention",
        F.scaled_dot_product_attention_forward,
        F.scaled_dot_product_attention_backward,
        ("q", "k", "v", "bias"),
        sdpa_cases,
        sdpa_sample,
    ),
    Pair("add", LY.add_forward, LY.add_backward, ("a", "b"), sample=add_sample),
    Pair("embedding", LY.embedding_forward, LY.embedding_backward, ("table",), embedding_cases, embedding_sample),
    Pair(
        "softmax_cross_entropy",
        LY.softmax_cross_entropy_forward,
        LY.softmax_cross_entropy_backward,
        ("logits",),
        softmax_cross_entropy_cases,
        scalar_output=True,
    ),
    Pair(
        "bert_embeddings",
        LY.bert_embeddings_forward,
        LY.bert_embeddings_backward,
        ("word", "position", "token_type"),
        sample=bert_embeddings_sample,
    ),
    Pair(
        "layer_norm",
        LY.layer_norm_forward,
        LY.layer_norm_backward,
        ("x", "gamma", "beta"),
        layer_norm_cases,
        layer_norm_sample,
    ),
    Pair("gelu", LY.gelu_forward, LY.gelu_backward, ("x",), sample=gelu_sample),
    Pair(
        "feed_forward",
        LY.feed_forward_forward,
        LY.feed_forward_backward,
        ("x", "W1", "b1", "W2", "b2"),
        sample=feed_forward_sample,
    ),
    Pair("rms_norm", F.rms_norm_forward, F.rms_norm_backward, ("x", "weight"), sample=rms_norm_sample),
    Pair("silu", LY.silu_forward, LY.silu_backward, ("x",), sample=silu_sample),
    Pair("swiglu", LY.swiglu_forward, LY.swiglu_backward, ("x", "W_gate", "W_up", "W_down"), sample=swiglu_sample),
    Pair("mean_pool", LY.mean_pool_forward, LY.mean_pool_backward, ("x",), sample=mean_pool_sample),
    Pair("soft_cap", F.soft_cap_forward, F.soft_cap_backward, ("scores",), soft_cap_cases, soft_cap_sample),
    Pair(
        "rope_interleaved",
        F.rope_interleaved_forward,
        F.rope_interleaved_backward,
        ("x",),
        sample=rope_interleaved_sample,
    ),  # fmt: skip
    Pair("rotary", F.rotary_forward, F.rotary_backward, ("x",), sample=rotary_sample),
    Pair(
        "concat_features",
        F.concat_features_forward,
        F.concat_features_backward,
        ("a", "b"),
        sample=concat_features_sample,
    ),  # fmt: skip
    Pair(
        "sink_softmax",
        F.sink_softmax_forward,
        F.sink_softmax_backward,
        ("x", "sink"),
        sink_softmax_cases,
        sink_softmax_sample,
    ),
    Pair(
        "relative_position_bias",
        F.relative_position_bias_forward,
        F.relative_position_bias_backward,
        ("table",),
        relative_position_bias_cases,
    ),
    Pair(
        "head_temperature_score",
        *score_term_pair(
            F.head_temperature_score, F.head_temperature_score_vjp, ("head_temperature",), ("head_temperature",)
        ),
        ("scores", "head_temperature"),
        sample=head_temperature_sample,
    ),  # fmt: skip
    Pair(
        "relative_position_score",
        *score_term_pair(F.relative_position_score, F.relative_position_score_vjp, ("rel_bias", "keys"), ("rel_bias",)),
        ("scores", "rel_bias"),
        sample=relative_position_sample,
    ),  # fmt: skip
    Pair(
        "alibi_score",
        *score_term_pair(F.alibi_score, F.alibi_score_vjp, ("slopes", "keys"), offset=1),
        ("scores",),
        sample=alibi_sample,
    ),  # fmt: skip
    Pair("diff_values", F.diff_values_forward, F.diff_values_backward, ("v",), sample=diff_values_sample),
    Pair(
        "diff_lambda",
        F.diff_lambda_forward,
        F.diff_lambda_backward,
        ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"),
        sample=diff_lambda_sample,
    ),
    Pair(
        "diff_combine",
        F.diff_combine_forward,
        F.diff_combine_backward,
        ("context", "lam"),
        sample=diff_combine_sample,
    ),
    Pair("partial_rope", F.partial_rope_forward, F.partial_rope_backward, ("x",), sample=partial_rope_sample),
    Pair("gate_query", F.gate_query_forward, F.gate_query_backward, ("x",), sample=gate_query_sample),
    Pair("output_gate", F.output_gate_forward, F.output_gate_backward, ("x", "q"), sample=output_gate_sample),
    Pair(
        "merge_attention",
        F.merge_attention_forward,
        F.merge_attention_backward,
        ("contexts", "lses"),
        sample=merge_attention_sample,
    ),  # two outputs (context, lse): the backward takes d_context, cache, d_lse
    # the pieces of the delta-rule layers (recurrent/, docs/deltanet_layer.md)
    Pair(
        "causal_conv1d",
        CV.causal_conv1d_forward,
        CV.causal_conv1d_backward,
        ("x", "weight", "bias", "initial_state"),
        sample=causal_conv1d_sample,
    ),  # two outputs (y, final_state): the backward takes d_y, cache, d_final_state
    Pair(
        "gated_rms_norm",
        NM.gated_rms_norm_forward,
        NM.gated_rms_norm_backward,
        ("x", "z", "weight"),
        sample=gated_rms_norm_sample,
    ),
    Pair("decay", GT.decay_forward, GT.decay_backward, ("a", "A_log", "dt_bias"), sample=decay_sample),
    Pair("sigmoid", GT.sigmoid_forward, GT.sigmoid_backward, ("x",), sample=sigmoid_sample),
    Pair("softplus", GT.softplus_forward, GT.softplus_backward, ("u",), sample=softplus_sample),
    Pair(
        "log_length_scale_score",
        *score_term_pair(
            F.log_length_scale_score, F.log_length_scale_score_vjp, ("attn_scale", "floor_scale"), offset=2
        ),
        ("scores",),
        sample=log_length_scale_sample,
    ),  # fmt: skip
]


def find(name: str) -> Pair:
    """The pair ``name`` (KeyError naming the known pairs otherwise)."""
    for pair in PAIRS:
        if pair.name == name:
            return pair
    raise KeyError(f"no pair {name!r}; known: {', '.join(p.name for p in PAIRS)}")
