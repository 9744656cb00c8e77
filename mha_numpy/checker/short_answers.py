"""The short parts of the exercise notebooks' inline questions: a number, a shape, a choice, checked in the notebook.

    from mha_numpy.checker import short_answers

    inline_1 = None  # "yes" or "no": does each row of p * (1 - p) * dp sum to 0 too?
    short_answers.check("ex05.inline_1", inline_1)  # -> ex05.inline_1: not answered yet ...

An inline question ("**Inline question N.**" in ``exercises/exNN_*.ipynb``) whose answer is a number, a shape, one of
named options or a yes/no has a form here under the key ``"exNN.inline_N"``; what it asks in words (the *why*) is
graded by the teacher with the rubric of ``checker.rubric``. A question may have both, or only one of them.

The judges are ``checker.answers``'s (``numbers``, ``exactly``, ``choice``, ``choices``) with their conventions: a
hand answer is right to 4 significant digits, a wrong one says what is wrong and never the expected value, and
the expected values come from the library or an independent route (a bug of ``checker.bugs`` run against the
library's pair, NumPy doing what the question describes), never from a notebook's output. ``check`` never raises
on a wrong or missing answer. The model answers are in ``exercises/solutions/inline.py``, proven by
``tests/test_short_answers.py``.

``Form.says`` is the comment of the form's line in the notebook: what to write and in which form. In teacher mode
(``checker.written``) the answer is read from that line as written, never run: a literal (numbers, strings, tuples,
lists, True / False) or arithmetic on numbers, like ``4 * 16384**2 * 4``.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import functional as F
from ..models import layers
from ..recurrent import delta_rule as rule
from . import answers, bugs
from . import delta_rule as DR
from .answers import Judge, Verdict, choice, choices, exactly, numbers


@dataclass(frozen=True)
class Form:
    """The short part of one inline question: ``judge`` as in ``checker.answers``, worth ``points``; ``says``: the
    comment on the form's line (what to write, e.g. "a shape, e.g. (2, 3)")."""

    judge: Judge
    says: str
    points: float = 1.0


NOT_A_LITERAL = "not a literal: write the value (a number, a string, a tuple or a list), not a name or a call"


def check(key: str, answer: Any) -> Verdict:
    """Judge ``answer`` to the short part of inline question ``key`` (e.g. ``"ex05.inline_1"``); None: not answered.

    An answer that no value written out can be (a NumPy array or number: ``np.zeros(3)`` on the form's line) is
    not answered, as the teacher's grade, which reads the line and does not run it, would find it."""
    if key not in FORMS:
        raise KeyError(f"no short answer {key!r}; the keys are {sorted(FORMS)}")
    if answer is not None and not written_out(answer):
        return Verdict(key, answers.NOT_ANSWERED, NOT_A_LITERAL)
    return answers.judged(key, FORMS[key].judge, answer)


def written_out(answer: Any) -> bool:
    """Whether ``answer`` is what a literal or arithmetic on numbers gives: Python's bool, int, float and str, in
    tuples and lists (not NumPy's arrays and numbers, whatever they hold)."""
    if isinstance(answer, tuple | list):
        return all(written_out(item) for item in answer)
    return type(answer) in (bool, int, float, str)


# ---- the expected values, each from the library or an independent route ----


def _fancy_add() -> np.ndarray:
    """What NumPy leaves in a after a[[1, 1]] += 1 (buffered: one write per distinct index)."""
    a = np.zeros(3)
    a[[1, 1]] += 1.0
    return a


def _head0() -> np.ndarray:
    """(token, feature) of each number of head 0 when x (L = 3, E = 4) is split by x.reshape(B, H, L, d), H = 2."""
    L, E, H = 3, 4, 2
    where = np.stack(np.indices((L, E)), axis=-1)  # (L, E, 2): entry = its own (token, feature)
    return where.reshape(H, L, E // H, 2)[0].reshape(-1, 2)  # (L·d, 2): head 0's numbers in memory order


def _spread16() -> str:
    """What softmax makes of scores spread by 16 (the std of q·k for d = 256): its largest weight, on average."""
    scores = 16.0 * np.random.default_rng(0).standard_normal((200, 16))  # (200 rows, 16 keys)
    return "nearly one-hot" if F.softmax_forward(scores)[0].max(axis=-1).mean() > 0.9 else "nearly uniform"


def _dropout_factor() -> np.ndarray:
    keep = np.array([True, False, True])
    return F.dropout_backward(np.ones(3), F.dropout_forward(np.ones(3), 0.25, keep_mask=keep)[1])


def _diagonal_sums_to_zero() -> str:
    """Whether the rows of the diagonal shortcut p(1 − p)dp sum to 0 (a random case)."""
    rng = np.random.default_rng(0)
    p = F.softmax_forward(rng.standard_normal((4, 5)))[0]  # (4, 5)
    wrong = bugs.softmax_backward_diagonal(rng.standard_normal((4, 5)), p)
    return "yes" if np.abs(wrong.sum(axis=-1)).max() < 1e-12 else "no"


def _nan_or_not() -> str:
    with np.errstate(invalid="ignore"):
        return str(float(np.exp(-np.inf - (-np.inf))))  # "nan"


def _zero_rows() -> list[int]:
    """The rows of d_tok_emb that are exactly 0 for tokens [[2, 5, 2]] and V = 8: by the library's embedding pair."""
    ids = np.array([[2, 5, 2]])
    _, cache = layers.embedding_forward(ids, np.zeros((8, 4)))
    d_table = layers.embedding_backward(np.random.default_rng(0).standard_normal((1, 3, 4)), cache)
    return [int(i) for i in np.flatnonzero(~d_table.any(axis=1))]


def _layer_norm_row_sum() -> float:
    """The largest |row sum| of dx by the library's LayerNorm pair (γ, β and dy random, eps of BERT's size)."""
    rng = np.random.default_rng(0)
    x, dy = rng.standard_normal((2, 4, 6))  # (rows, features) each
    _, cache = layers.layer_norm_forward(x, rng.standard_normal(6), rng.standard_normal(6), 1e-12)
    return float(np.abs(layers.layer_norm_backward(dy, cache)[0].sum(axis=-1)).max())


def _rope_pair_ratio() -> float:
    """‖dx‖ / ‖d_out‖ of one turned pair (features 1 and 1 + d/2 at position 3) by the library's RoPE backward."""
    rng = np.random.default_rng(0)
    x, d_out = rng.standard_normal((2, 1, 1, 4, 8))  # (B, H, L, d) each
    dx = F.rope_backward(d_out, F.rope_forward(x)[1])
    pair = [1, 5]
    return float(np.linalg.norm(dx[0, 0, 3, pair]) / np.linalg.norm(d_out[0, 0, 3, pair]))


REPEAT_KV_WRONG = {  # the wrong repeat_kv backwards inline question 2 of exercise 11 names, from checker.bugs
    "n_rep * d_out[:, ::n_rep]": lambda d, cache: cache[1] * bugs.repeat_kv_backward_first_head(d, cache),
    "the mean over the group": bugs.repeat_kv_backward_mean,
    "the sum in np.tile's grouping": bugs.repeat_kv_backward_tiled,
}


def _still_shows() -> str:
    """The wrong repeat_kv backward that an all-ones upstream gradient still tells from the library's."""
    d_out = np.ones((1, 6, 2, 3))  # (B, Hkv · n_rep, L, d), Hkv = 2, n_rep = 3
    right = F.repeat_kv_backward(d_out, F.repeat_kv_forward(np.zeros((1, 2, 2, 3)), 3)[1])
    (shows,) = [name for name, wrong in REPEAT_KV_WRONG.items() if not np.allclose(wrong(d_out, ((1, 2, 2, 3), 3)),
                                                                                    right)]  # fmt: skip
    return shows


def _most_read_column() -> tuple[int, int]:
    """(the column of rel_bias read most often, how often) for R = 2, Lq = 4, Lk = 6: the library's score term on a
    table whose entries are their column numbers."""
    i, j = np.indices((4, 6))  # (Lq, Lk) each
    columns = F.relative_position_score(np.zeros((4, 6)), 0, 0, i, j, rel_bias=np.arange(5.0)[None]).astype(int)
    counts = np.bincount(columns.ravel(), minlength=5)
    return int(counts.argmax()), int(counts.max())


def _soft_cap_bound(cap: float = 2.0, agree: float = 1e-6) -> float:
    """The largest |s| where 1 − soft_cap_backward(1, s) ≤ 1e-6: the library's backward, bisected."""

    def gap(s):
        return 1.0 - float(F.soft_cap_backward(1.0, F.soft_cap_forward(np.array(s), cap)[1]))

    lo, hi = 0.0, cap
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if gap(mid) <= agree else (lo, mid)
    return lo


def _blocked_sink_row() -> np.ndarray:
    """[dx (3 keys), d_sink] of a row whose keys are all blocked, sink logit 0, a random dp: the library's pair."""
    p, cache = F.sink_softmax_forward(np.full(3, -np.inf), np.zeros(()))
    dx, d_sink = F.sink_softmax_backward(np.random.default_rng(0).standard_normal(3), cache)
    return np.append(dx, d_sink)


def _flash_bytes(L: int = 16384, H: int = 4) -> tuple[int, int]:
    """(bytes of P, bytes of m and 1/ℓ) of one sequence in float32."""
    size = np.dtype(np.float32).itemsize
    return H * L * L * size, 2 * H * L * size


DELTA_GRADIENTS = ("dq", "dk", "dv", "dg", "dbeta", "dS0")  # the order delta_rule_recurrent_backward returns them


def _delta_case(per_channel: bool = False):
    """q, k (unit keys), v, g, β, S₀ and d_o of a small seeded case (B = 1, H = 2, L = 5, dk = 3, dv = 4)."""
    rng = np.random.default_rng(0)
    B, H, L, dk, dv = 1, 2, 5, 3, 4
    q, k = rng.standard_normal((2, B, H, L, dk))
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    g = -rng.uniform(0.1, 1.0, (B, H, L, dk) if per_channel else (B, H, L))
    v, beta, S0 = (
        rng.standard_normal((B, H, L, dv)),
        rng.uniform(0.2, 0.9, (B, H, L)),
        rng.standard_normal((B, H, dk, dv)),
    )
    return q, k, v, g, beta, S0, rng.standard_normal((B, H, L, dv))  # ..., d_o


def _delta_differs(wrong, last_token_only: bool) -> list[str]:
    """The gradients (of the last token, or of any token) where ``wrong`` differs from the library's backward."""
    q, k, v, g, beta, S0, d_o = _delta_case()
    o, cache = DR.delta_rule_recurrent_forward(q, k, v, g, beta, S0)
    right, bad = DR.delta_rule_recurrent_backward(d_o, cache), wrong(d_o, cache)
    differs = []
    for name, r, w in zip(DELTA_GRADIENTS, right, bad, strict=True):
        if last_token_only and name == "dS0":
            continue
        r, w = (r[:, :, -1], w[:, :, -1]) if last_token_only else (r, w)
        if not np.allclose(r, w, rtol=1e-10, atol=1e-12):
            differs.append(name)
    return differs


def _kda_dg_shape() -> tuple[int, ...]:
    """The shape of ḡ with one decay per key channel (g: (B, H, L, dk)), by the library's recurrent backward."""
    q, k, v, g, beta, S0, d_o = _delta_case(per_channel=True)
    _, cache = rule.delta_rule_recurrent_forward(q, k, v, g, beta, S0, checkpoint=2)
    return rule.delta_rule_recurrent_backward(d_o, None, cache)[3].shape


FORMS: dict[str, Form] = {
    "ex01.inline_1": Form(
        exactly(lambda: np.zeros((2, 5, 3)).sum(axis=0).shape, "axis 0 is the batch: the positions are still there"),
        "the shape of dy.sum(axis=0) for dy of shape (B, L, out) = (2, 5, 3): a tuple, e.g. (7,)",
    ),
    "ex01.inline_2": Form(
        numbers(_fancy_add, "a[[1, 1]] += 1 reads a[1] once, adds, and writes once per distinct index"),
        "a after a = np.zeros(3); a[[1, 1]] += 1.0: a list of 3 numbers",
    ),
    "ex02.inline_1": Form(
        exactly(_head0, "reshape fills head 0 with the first L·d numbers of x in memory order"),
        "head 0 of x.reshape(B, H, L, d), L = 3, E = 4, H = 2: the (token, feature) of each of its 6 numbers in "
        "memory order, a list of 6 pairs, e.g. [(0, 0), ...]",
    ),
    "ex02.inline_2": Form(
        choice(
            "a comparison with a reference forward",
            ("finite differences", "a random upstream gradient", "a comparison with a reference forward"),
            "the pair is consistent: its backward is the exact adjoint of its own (wrong) forward",
        ),
        'which check catches it: "finite differences", "a random upstream gradient" or "a comparison with a '
        'reference forward"',
    ),
    "ex03.inline_1": Form(
        choice(_spread16(), ("nearly one-hot", "nearly uniform"), "exp magnifies a gap of 16 into a factor e^16"),
        'the softmax of scores with standard deviation 16: "nearly one-hot" or "nearly uniform"',
    ),
    "ex04.inline_2": Form(
        numbers(_dropout_factor, "the backward multiplies by what the forward multiplied by"),
        "what the backward multiplies d_out by, for p = 0.25 and keep = [True, False, True]: a list of 3 numbers",
    ),
    "ex05.inline_1": Form(
        choice(_diagonal_sums_to_zero(), ("yes", "no"), "Σ_i p_i (1 − p_i) dp_i: is there a reason for it to be 0?"),
        '"yes" or "no": does each row of p * (1 - p) * dp sum to 0 too?',
    ),
    "ex05.inline_2": Form(
        answers.QUESTIONS["10.ones_dx"],
        "dx of the correct softmax backward for x = [1, 2, 0] and dp = np.ones(3): a list of 3 numbers",
    ),
    "ex06.inline_2": Form(
        choice(
            "absolute, against the largest gradient",
            ("relative to its own size", "absolute, against the largest gradient"),
            "the relative error of a number that should be 0 is rounding noise divided by rounding noise",
        ),
        'how a check judges a gradient that is 0 in theory: "relative to its own size" or "absolute, against the '
        'largest gradient"',
    ),
    "ex06.inline_3": Form(
        choice(
            "of the order of the gradient",
            ("rounding, about 1e-12", "small, about 1e-6", "of the order of the gradient"),
            "the missing key and value paths are as large as the query path",
        ),
        'how large the error is: "rounding, about 1e-12", "small, about 1e-6" or "of the order of the gradient"',
    ),
    "ex07.inline_1": Form(
        choice(
            "m and 1/l",
            ("the weights P", "the log-sum-exp m + log l", "m and 1/l"),
            "docs/performance.md, 'The backward without P': why m and l are not folded into one number",
        ),
        'what the chunked backward keeps per query instead of the weights: "the weights P", "the log-sum-exp '
        'm + log l" or "m and 1/l"',
    ),
    "ex07.inline_2": Form(
        choice(_nan_or_not(), ("0", "1", "nan", "inf"), "−∞ − (−∞) is not 0"),
        'what np.exp(m - m_new) gives for m = m_new = -inf: "0", "1", "nan" or "inf"',
    ),
    "ex08.inline_1": Form(
        numbers(_layer_norm_row_sum, "x̂ does not change when x shifts by a constant"),
        "what each row of dx sums to: a number",
    ),
    "ex09.inline_2": Form(
        choice(
            "scores",
            ("x", "q", "k", "v", "scores", "weights", "ctx", "a", "h"),
            "softmax ignores a constant added to a row of its input",
        ),
        'the other gradient of the table that sums to 0 along one axis: one of "x", "q", "k", "v", "scores", '
        '"weights", "ctx", "a", "h"',
    ),
    "ex09.inline_3": Form(
        exactly(_zero_rows, "a row is 0 when nothing looked it up"),
        "the rows of d_tok_emb that are exactly 0 for tokens = [[2, 5, 2]] and V = 8: a list of row numbers, ascending",
    ),
    "ex10.inline_3": Form(
        choice("LN2", ("LN1", "LN2"), "in a post-norm block the output y is a LayerNorm's output"),
        'the LayerNorm whose backward d_y passes before it splits: "LN1" or "LN2"',
    ),
    "ex11.inline_1": Form(
        numbers(_rope_pair_ratio, "a rotation keeps lengths"),
        "‖dx‖ / ‖d_out‖ for one turned pair of features: a number",
    ),
    "ex11.inline_2": Form(
        choice(_still_shows(), tuple(REPEAT_KV_WRONG), "which of them gives each KV head n_rep times one head's g?"),
        'the wrong repeat_kv_backward an all-ones upstream gradient still shows: "n_rep * d_out[:, ::n_rep]", '
        '"the mean over the group" or "the sum in np.tile\'s grouping"',
    ),
    "ex12.inline_1": Form(
        exactly(_most_read_column, "the column is clip(j − i, −R, R) + R; count the (i, j) of each"),
        "(the column read most often, how many times) for R = 2, Lq = 4, Lk = 6: a tuple of 2 ints",
    ),
    "ex12.inline_2": Form(
        numbers(_soft_cap_bound, "the two differ by d_out · tanh²(s / cap)"),
        "the largest |s| for which the backward without tanh' agrees with the right one to 1e-6, cap = 2: a number",
    ),
    "ex12.inline_3": Form(
        numbers(_blocked_sink_row, "every p_j of the row is 0, so D = Σ p_j dp_j is 0 too"),
        "[dx_0, dx_1, dx_2, d_sink] for a row of 3 keys all blocked, sink logit 0, any dp: a list of 4 numbers",
    ),
    "ex13.inline_2": Form(
        exactly(_flash_bytes, "P is (H, Lq, Lk) per sequence; m and 1/ℓ are two numbers per query and head"),
        "(bytes of the plain backward's P, bytes of m and 1/ℓ) for one sequence at Lq = Lk = 16384, H = 4, float32: "
        "a tuple of 2 ints (arithmetic like 2 * 8 is fine)",
    ),
    "ex14.inline_1": Form(
        choices(
            lambda: sorted(set(DELTA_GRADIENTS[:5]) - set(_delta_differs(DR.delta_backward_with(carry=False), True))),
            DELTA_GRADIENTS[:5],
            "at the last token nothing comes after it: what would the carry hold?",
        ),
        'the last token\'s gradients that are right without the carry: a list of some of "dq", "dk", "dv", "dg", '
        '"dbeta"',
    ),
    "ex14.inline_2": Form(
        choices(
            lambda: _delta_differs(DR.delta_backward_with(decay_after=False), False),
            DELTA_GRADIENTS,
            "the write β_t k_t u_tᵀ is not decayed: which gradients come from it?",
        ),
        'the gradients that change when S̄ is multiplied by a_t before ← R3: a list of some of "dq", "dk", "dv", '
        '"dg", "dbeta", "dS0"',
    ),
    "ex14.inline_3": Form(
        exactly(_kda_dg_shape, "one decay per key channel: ḡ has g's shape"),
        "the shape of ḡ for B = 1, H = 2, L = 5, dk = 3, dv = 4 with one decay per key channel: a tuple",
    ),
}


def variable(key: str) -> str:
    """The name the form of ``key`` binds: ``"ex05.inline_1"`` -> ``inline_1``."""
    return key.split(".", 1)[1]


def form_cell(key: str) -> str:
    """The source of the code cell under the question ``key``: the import, what to write (``says``, as comment
    lines), the form's line ``inline_N = None`` and the check."""
    says = textwrap.wrap(FORMS[key].says, 116, break_on_hyphens=False)
    comments = "\n".join(f"# {line}" for line in says)
    name = variable(key)
    check = f'short_answers.check("{key}", {name})'
    return f"from mha_numpy.checker import short_answers\n\n{comments}\n{name} = None\n{check}"
