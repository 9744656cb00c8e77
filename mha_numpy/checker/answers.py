"""Exercises at the end of every notebook: ``answer = None`` is "not answered yet"; a wrong answer says what is wrong.

    from mha_numpy.checker import answers

    jacobian = None  # your answer: a (3, 3) array
    answers.check("03.softmax_jacobian", jacobian)  # -> 03.softmax_jacobian: not answered yet ...

``check(key, answer)`` never raises on a wrong or missing answer (a committed notebook runs green with every
exercise unanswered); it returns a ``Verdict`` whose text the notebook shows. Each question in ``QUESTIONS`` has a
judge: ``None`` when the answer is right, otherwise one sentence saying what is wrong (the shape, the entry that is
off, a hint), never the expected value itself. The expected values are computed here, from the library or from an
independent route (finite differences for a Jacobian), not copied from a notebook's output.

The model solutions are in ``exercises/solutions/notebooks.py``; ``tests/test_notebook_exercises.py`` proves that
every check accepts its solution and rejects a wrong answer, and that every exercise cell of a notebook names a
question that exists here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import functional as F
from .. import rope_scaling as RS
from ..block_mask import create_block_mask
from ..flex_derive import STEP
from ..masks import EMPTY, FULL, PARTIAL, causal_mask, chunked_causal_mask, document_mod
from ..models import layers
from ..recurrent import gated_delta_rule_forward
from ..recurrent.mamba2 import Mamba2Mixer
from ..recurrent.qwen3_next import GatedDeltaNet
from ..recurrent.ssd import ssd_matrix_forward
from ..sparse import indexer_loss_backward, indexer_loss_forward, topk_select
from . import check_namespace

NOT_ANSWERED = "not answered yet"
CORRECT = "correct"
WRONG = "wrong"


@dataclass(frozen=True)
class Verdict:
    """What ``check`` says of one answer: ``status`` is NOT_ANSWERED, CORRECT or WRONG; ``message`` says why."""

    key: str
    status: str
    message: str = ""

    @property
    def correct(self) -> bool:
        return self.status == CORRECT

    def __repr__(self) -> str:
        return f"{self.key}: {self.status}{' — ' + self.message if self.message else ''}"


Judge = Callable[[Any], "str | None"]  # None: right; a str: what is wrong


def check(key: str, answer: Any) -> Verdict:
    """Judge ``answer`` to the question ``key`` (e.g. ``"03.softmax_jacobian"``); ``None`` means not answered yet."""
    if key not in QUESTIONS:
        raise KeyError(f"no exercise {key!r}; the keys are {sorted(QUESTIONS)}")
    return judged(key, QUESTIONS[key], answer)


def judged(key: str, judge: Judge, answer: Any) -> Verdict:
    """The Verdict of ``judge`` on ``answer`` (``None``: not answered yet): every registry of questions says it so
    (``checker.short_answers`` too)."""
    if answer is None:
        return Verdict(key, NOT_ANSWERED, "replace None with your answer and run the cell again")
    problem = judge(answer)
    return Verdict(key, CORRECT) if problem is None else Verdict(key, WRONG, problem)


# ---- the judges: numbers, exact values, a choice, a set of choices, a function checked by the checker ----


HAND_DIGITS = 4  # a hand answer is right when it agrees with the expected value to this many significant digits


def numbers(expected: Callable[[], Any], hint: str = "", rtol: float = 1e-6, atol: float = 1e-9) -> Judge:
    """A number or an array of numbers, right to ``rtol`` (relative to the largest expected entry) or ``atol``, or
    to ``HAND_DIGITS`` significant digits of its own entry: an answer worked out on paper and written with 4
    digits (1.083 for 1.0833155) is right, a wrong formula (0.8413 for it) is not."""
    digits = 0.5 * 10.0 ** (1 - HAND_DIGITS)  # 5e-4: half a unit of the 4th significant digit, relative

    def judge(answer):
        try:
            got = np.asarray(answer, dtype=np.float64)
        except (TypeError, ValueError):
            return f"expected a number or an array of numbers, got {type(answer).__name__}"
        want = np.asarray(expected(), dtype=np.float64)
        if got.shape != want.shape:
            return f"your answer has shape {got.shape}, the question asks for shape {want.shape}"
        tol = atol + rtol * max(1.0, float(np.abs(want).max(initial=0.0))) + digits * np.abs(want)
        bad = ~(np.abs(got - want) <= tol)  # a NaN is bad too
        if not bad.any():
            return None
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        at = f"entry {list(where)} is wrong (yours: {got[where]:.6g}; {int(bad.sum())} of {bad.size} off)"
        return (at if where else f"the value is wrong (yours: {float(got):.6g})") + (f". Hint: {hint}" if hint else "")

    return judge


def exactly(expected: Callable[[], Any], hint: str = "") -> Judge:
    """An exact value: an int, a tuple, a bool array (a mask), compared as equal arrays of the same shape and kind."""

    def judge(answer):
        want = np.asarray(expected())
        try:
            got = np.asarray(answer)
        except (TypeError, ValueError):  # a ragged list: no array at all
            return f"expected {'a value' if want.ndim == 0 else f'an array of shape {want.shape}'}, got a ragged list"
        if got.shape != want.shape:
            return f"your answer has shape {got.shape}, the question asks for shape {want.shape}"
        if want.dtype == bool and got.dtype != bool:
            return f"expected a bool array (True = may attend), got dtype {got.dtype}"
        if np.array_equal(got, want):
            return None
        if want.ndim == 0:
            return "not this one" + (f". Hint: {hint}" if hint else "")
        where = tuple(int(i) for i in np.argwhere(got != want)[0])
        return f"entry {list(where)} is wrong (yours: {got[where]})" + (f". Hint: {hint}" if hint else "")

    return judge


def choice(expected: str, options: tuple[str, ...], hint: str = "") -> Judge:
    """One of ``options`` (strings)."""

    def judge(answer):
        if not isinstance(answer, str) or answer not in options:
            return f"answer with one of {list(options)}"
        return None if answer == expected else "not this one" + (f". Hint: {hint}" if hint else "")

    return judge


def choices(expected: Callable[[], Any], options: tuple[str, ...], hint: str = "") -> Judge:
    """Some of ``options`` (a list or tuple of strings, in any order): right when it is the expected set."""

    def judge(answer):
        if isinstance(answer, str) or not isinstance(answer, list | tuple | set):
            return f"answer with a list of some of {list(options)}"
        unknown = [a for a in answer if not isinstance(a, str) or a not in options]
        if unknown:
            return f"{unknown} not among {list(options)}"
        want = set(expected())
        if set(answer) == want:
            return None
        what = "one that is not in the set" if set(answer) - want else "one is missing"
        return f"not this set: {what}" + (f". Hint: {hint}" if hint else "")

    return judge


def pair_function(name: str, half: str = "backward") -> Judge:
    """A function ``NAME_backward`` (or ``_forward``) of a pair the checker knows, checked by the checker."""

    def judge(answer):
        if not callable(answer):
            return f"expected a function {name}_{half}, got {type(answer).__name__}"

        report = check_namespace({f"{name}_{half}": answer}, only=[name])
        if report.passed:
            return None
        return "the checker says:\n" + "\n".join(report.row_text(r) for r in report.rows)

    return judge


# ---- the expected values, each from the library or an independent route ----


def _softmax(x):
    return F.softmax_forward(np.asarray(x, dtype=np.float64))[0]


def _jacobian_by_differences(f, x, h=1e-6):
    """J[i, j] = ∂f_i/∂x_j by central differences (independent of any hand-written backward)."""
    x = np.asarray(x, dtype=np.float64)
    cols = []
    for j in range(x.size):
        e = np.zeros_like(x)
        e[j] = h
        cols.append((f(x + e) - f(x - e)) / (2 * h))
    return np.stack(cols, axis=1)


Q01 = np.array([1.0, 2.0])
K01 = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
V01 = np.array([[1.0, 0.0], [0.0, 1.0], [2.0, 2.0]])


def _scores01():
    return F.attention_scores_forward(Q01[None, :], K01, 1 / np.sqrt(2))[0][0]  # (1, 2) @ (2, 3) -> (1, 3) -> (3,)


X03 = np.array([1.0, 2.0, 0.0])
DP03 = np.array([1.0, -1.0, 2.0])
X03_LIN = np.array([[1.0, 2.0], [0.0, 1.0], [3.0, -1.0]])  # (N=3, in=2)
W03 = np.array([[1.0, -1.0], [2.0, 0.5]])  # (out=2, in=2)
DY03 = np.array([[1.0, 0.0], [0.0, 2.0], [-1.0, 2.0]])  # (N=3, out=2)
KEEP04 = np.array([[True, True, False], [True, False, False]])
S05 = np.array([1.0, 3.0, 2.0, 5.0])
W08 = np.array([[1.0, 2.0], [0.0, 1.0]])
DY08 = np.array([1.0, -1.0])
DK09 = np.array([1.0, 2.0, 3.0, 4.0]).reshape(1, 4, 1, 1)  # (B, H=4, L=1, d=1), two query heads per KV head
S11 = np.array([10.0, 100.0])
X00 = np.array([-1.0, 0.0, 2.0])  # notebook 00: the keys of a Nadaraya–Watson query at 0, sigma = 1
C12 = [np.array([1.0, 0.0]).reshape(1, 1, 1, 2), np.array([0.0, 1.0]).reshape(1, 1, 1, 2)]  # two partials' contexts
LSE12 = [np.full((1, 1, 1), np.log(2.0)), np.full((1, 1, 1), np.log(6.0))]  # their log-sum-exps: sums 2 and 6


def _ring_work12(P=3, L=12):
    """(2, P): the scores each rank computes over a causal ring, contiguous then zigzag shards, counted from the
    causal mask's rows (not from ``mha_numpy.distributed``, which the notebook prints)."""
    seen = causal_mask(L).sum(axis=1)  # (L,): query i sees i + 1 keys
    c = L // (2 * P)  # zigzag: 2P chunks of c positions, rank r holds chunks r and 2P - 1 - r
    contiguous = [seen[r * 2 * c : (r + 1) * 2 * c].sum() for r in range(P)]
    zigzag = [seen[r * c : (r + 1) * c].sum() + seen[(2 * P - 1 - r) * c : (2 * P - r) * c].sum() for r in range(P)]
    return np.array([contiguous, zigzag])


def _causal_tiles(L=8, tile=2):
    allowed = np.tril(np.ones((L, L), dtype=bool))
    return sum(allowed[i : i + tile, j : j + tile].any() for i in range(0, L, tile) for j in range(0, L, tile))


def _gelu_slope(x):
    h = 1e-6
    return (layers.gelu(x + h) - layers.gelu(x - h)) / (2 * h)


def _layer_norm_sums():
    rng = np.random.default_rng(0)
    x = rng.standard_normal(6)
    out, cache = layers.layer_norm_forward(x, np.ones(6), np.zeros(6), 1e-12)
    dx = layers.layer_norm_backward(rng.standard_normal(6), cache)[0]
    x_hat = (x - x.mean()) / x.std()
    return [dx.sum(), dx @ x_hat]


QUESTIONS: dict[str, Judge] = {
    # 01: the forward pass
    "01.scores": numbers(_scores01, "the score is q·k_j divided by √d, with d = 2"),
    "01.weights": numbers(lambda: _softmax(_scores01()), "softmax of your scores: exp, then divide by the sum"),
    "01.context": numbers(lambda: _softmax(_scores01()) @ V01, "the weighted sum Σ_j w_j v_j, a vector of 2"),
    # 02: masks
    "02.causal_mask": exactly(lambda: np.tril(np.ones((4, 4), dtype=bool)), "query i may see keys 0 … i"),
    "02.padding_mask": exactly(lambda: np.arange(3) < np.array([[3], [1]]), "sentence 1 has one real token"),
    "02.masked_rows": numbers(
        lambda: _softmax([[0.5, -np.inf, -np.inf], [-np.inf, -np.inf, -np.inf]]),
        "a row with one allowed key puts all its weight there; a row with none gets weights 0, never NaN",
    ),
    # 03: the backward pass
    "03.softmax_jacobian": numbers(
        lambda: _jacobian_by_differences(_softmax, X03),
        "J = diag(p) − p pᵀ; every row sums to 0, and the off-diagonal entries are not 0",
        rtol=1e-6,
    ),
    "03.softmax_vjp": numbers(
        lambda: F.softmax_backward(DP03, F.softmax_forward(X03)[1]), "dx = p ∘ (dp − Σ_j p_j dp_j); it sums to 0"
    ),
    "03.linear_dW": numbers(
        lambda: F.linear_backward(DY03, F.linear_forward(X03_LIN, W03)[1])[1],
        "dW has W's shape (out, in) and sums over the N rows: dyᵀ x",
    ),
    # 04: the PyTorch conventions
    "04.key_padding_mask": exactly(lambda: ~KEEP04, "torch's key_padding_mask is True where a key is ignored"),
    "04.in_proj_rows": exactly(lambda: (8, 12), "in_proj_weight stacks W_q, W_k, W_v, each E rows"),
    # 05: performance
    "05.score_bytes": exactly(lambda: 1 * 12 * 4096 * 4096 * 8, "B·H·L·L entries of 8 bytes"),
    "05.online_softmax": numbers(
        lambda: [S05.max(), np.exp(S05 - S05.max()).sum()],
        "after each block ℓ ← ℓ·exp(m_old − m_new) + Σ exp(s − m_new); at the end m is the row max",
    ),
    "05.causal_tiles": exactly(_causal_tiles, "a tile above the diagonal has no allowed entry; count the others"),
    # 06: BERT's maps
    "06.moved": numbers(lambda: np.array([0.9, 0.1]) * np.array([0.1, 2.0]), "‖α_j v_j‖ = α_j ‖v_j‖"),
    "06.entropy": numbers(lambda: np.log(2) / np.log(4), "entropy −Σ p log p, divided by log(number of tokens)"),
    # 07: training
    "07.ce_grad": numbers(
        lambda: layers.softmax_cross_entropy_backward(
            1.0, layers.softmax_cross_entropy_forward(np.array([[2.0, 1.0, 0.0]]), np.array([0]))[1]
        )[0],  # (1, 3) -> (3,)
        "the gradient of the mean cross-entropy w.r.t. the logits is softmax(logits) − one_hot(target), over N",
    ),
    "07.reverse_map": numbers(lambda: np.eye(4)[::-1], "output position i must read input position 3 − i"),
    # 08: a whole BERT
    "08.residual": numbers(
        lambda: DY08 + F.linear_backward(DY08, F.linear_forward(np.zeros(2), W08)[1])[0],
        "two paths reach x: the skip (dy) and the branch (dy W); add them",
    ),
    "08.gelu_slope": numbers(lambda: _gelu_slope(np.array([0.0, 1.0])), "GELU'(x) = Φ(x) + x φ(x)", rtol=1e-7),
    "08.layer_norm_sums": numbers(_layer_norm_sums, "LayerNorm's output does not change when x shifts or scales"),
    # 09: today's attention
    "09.repeat_kv": numbers(
        lambda: F.repeat_kv_backward(DK09, F.repeat_kv_forward(np.zeros((1, 2, 1, 1)), 2)[1]).ravel(),
        "each KV head served a group of query heads; its gradient is the sum over its group",
    ),
    "09.rope_score": numbers(lambda: np.cos((3 - 1) * np.pi / 6), "the rotated q·k depends only on (i − j)·θ"),
    "09.alibi": numbers(lambda: -0.5 * (3 - np.arange(4.0)), "the bias is −slope · (i − j), 0 on the diagonal"),
    # 10: the bug gallery
    "10.blind_check": choice(
        "finite differences",
        ("finite differences", "a reference pair"),
        "a consistent wrong pair agrees with its own forward",
    ),
    "10.ones_dx": numbers(
        lambda: F.softmax_backward(np.ones(3), F.softmax_forward(X03)[1]),
        "with dp all ones, dp − Σ_j p_j dp_j is 0 in every entry",
        atol=1e-12,
    ),
    "10.dropout_backward": pair_function("dropout"),
    # 11: today's attention, part two
    "11.soft_cap": numbers(lambda: F.soft_cap_forward(S11, 30.0)[0], "cap · tanh(s / cap) with cap = 30"),
    "11.soft_cap_grad": numbers(
        lambda: F.soft_cap_backward(np.ones(2), F.soft_cap_forward(S11, 30.0)[1]), "1 − tanh²(s / cap)"
    ),
    "11.sink": numbers(
        lambda: F.sink_softmax_forward(np.zeros(2), np.zeros(()))[0], "the sink adds exp(0) = 1 to the denominator"
    ),
    "11.keys_seen": numbers(
        lambda: causal_mask(3, 8, align="bottom-right").sum(-1),
        "new query i is the token at position 5 + i: it sees keys 0 … 5 + i",
    ),
    # 00: the road to attention
    "00.nw_weights": numbers(
        lambda: F.softmax_forward(-((0.0 - X00) ** 2) / 2.0)[0],
        "the Gaussian kernel's weights are a softmax of −(q − x)² / 2σ², not of q·x",
    ),
    "00.score_variance": numbers(
        lambda: np.var(_products(64, 2.0)), "Var(q·k) = Σ Var(q_i k_i) and Var(q_i k_i) = v · v", rtol=0.05
    ),
    # 12: merging partial attention
    "12.merge_context": numbers(
        lambda: F.merge_attention_forward(C12, LSE12)[0][0].ravel(),
        "each partial weighs by its share of the whole denominator, exp(lse_s − lse)",
    ),
    "12.merge_lse": numbers(
        lambda: F.merge_attention_forward(C12, LSE12)[0][1].ravel()[0],
        "the denominators add: lse = log(e^lse₁ + e^lse₂)",
    ),
    "12.ring_work": exactly(
        _ring_work12, "a rank computes each of its queries' allowed scores once over the ring: query i has i + 1"
    ),
    # 13: learned cross-attention
    "13.cache_rows": exactly(
        lambda: (5, 8),  # the self-attention cache grows one position a step; the memory's K is made once, 8 rows
        "the decoder's self-attention keys are its own tokens so far; the cross-attention keys are the source's",
    ),
    "13.memory_grad_terms": exactly(
        lambda: 2 * 2,  # every decoder layer's cross-attention reads the memory twice, as its keys and its values
        "the memory is the key and the value of every decoder layer's cross-attention",
    ),
    # 14: your own attention
    "14.rel_bias_columns": numbers(
        lambda: _rel_bias_columns(), "the column is clip(j − i, −R, R) + R: the distance from the query to the key"
    ),
    "14.abs_complex_step": numbers(
        lambda: _abs_complex_step(), "|s + iε| is a real number; |s| falls as s rises below 0"
    ),
    "14.document_blocks": exactly(
        lambda: _document_blocks(), "a block is full only when every one of its entries is allowed"
    ),
    # 15: attention as a recurrence
    "15.half_step": numbers(
        lambda: _half_step(), "the second write adds β·k·uᵀ with u = v_2 − S_1ᵀk: it first removes half of what is in"
    ),
    "15.decay_entry": numbers(
        lambda: _decay_entry(), "token j's write is decayed by the tokens after it, j < s ≤ t, not by its own g_j"
    ),
    "15.state_floats": exactly(
        lambda: _state_floats(), "the state is the conv's last K − 1 inputs of every channel and S of every value head"
    ),
    # 16: today's attention, part three
    "16.interleave_order": exactly(
        lambda: _interleave_order(),
        "the features of pair i: (2i, 2i + 1) interleaved, (i, i + 4) half-split; order[j] says which x goes to j",
    ),
    "16.yarn_scores": numbers(
        lambda: _yarn_scores(), "the factor multiplies cos and sin, so every turned feature of q and of k"
    ),
    "16.llama3_pairs": exactly(
        lambda: _llama3_pairs(), "λ_i < 2048 kept, λ_i > 8192 divided, the pairs between mixed: solve for i"
    ),
    "16.chunk_pairs": exactly(
        lambda: int(chunked_causal_mask(8, chunk_size=3).sum()),
        "the chunks are positions 0-2, 3-5, 6-7, each causal inside",
    ),
    # 17: sparse attention
    "17.topk_keys": numbers(
        lambda: _topk_keys(), "only keys 0 ... 4 are allowed; of the equal scores at the k-th place, the lower index"
    ),
    "17.loss_grad": numbers(
        lambda: _loss_grad(), "∂KL/∂I = softmax(I) · Σp − p: the model's distribution minus the target, not the reverse"
    ),
    "17.selected_scores": exactly(
        lambda: _selected_scores(), "query t has t + 1 keys to choose from: the first queries fill fewer than k slots"
    ),
    # 18: state-space duality
    "18.decay_entry": numbers(
        lambda: _ssd_decay_entry(), "token j's write is decayed by the tokens after it, j < t ≤ i, not by its own a_j"
    ),
    "18.block_rank": exactly(
        lambda: _ssd_block_rank(), "the block reaches chunk 2 only through the state entering it: an (N, P) matrix"
    ),
    "18.state_bytes": exactly(
        lambda: _mamba2_state_bytes(), "the conv keeps its last K − 1 inputs of x, B and C; S is (N, P) a head"
    ),
}


def _products(d: int, v: float, n: int = 50_000) -> np.ndarray:
    """n samples of q·k for q, k of d independent N(0, v) entries (seeded): an independent route to Var(q·k)."""
    rng = np.random.default_rng(0)
    q, k = rng.normal(0.0, np.sqrt(v), (2, n, d))  # (n, d) each
    return np.einsum("nd,nd->n", q, k)  # (n,)


def _rel_bias_columns() -> np.ndarray:
    """The columns of the module's rel_bias (R = 3) that (i, j) = (5, 1) and (0, 6) read: its own score term on a
    table whose entries are their column numbers."""
    table = np.arange(7.0)[None, :]  # (1, 2R + 1): entry = column
    q_idx, kv_idx = np.array([5, 0]), np.array([1, 6])  # (2,) each
    return F.relative_position_score(np.zeros(2), 0, 0, q_idx, kv_idx, rel_bias=table, keys=7)  # (2,)


def _abs_complex_step() -> list[float]:
    """[the complex step's derivative of |s| at s = -1.5, the true one by central differences]."""
    s, h = -1.5, 1e-6
    return [np.abs(s + 1j * STEP).imag / STEP, (abs(s + h) - abs(s - h)) / (2 * h)]


def _document_blocks() -> tuple[int, int, int]:
    """(empty, partial, full) blocks of the document mask of lengths [3, 5] at L = 8 in blocks of 2 × 2."""
    states = create_block_mask(document_mod([3, 5]), 1, 1, 8, 8, BLOCK_SIZE=2).states  # (1, 1, 4, 4)
    return tuple(int((states == state).sum()) for state in (EMPTY, PARTIAL, FULL))


def _delta_final_state(keys, values, g, beta) -> np.ndarray:
    """The delta rule's final state (d_k, d_v) after writing values (L, d_v) at keys (L, d_k), one head."""
    K, V = (np.asarray(a, dtype=np.float64)[None, None] for a in (keys, values))  # (1, 1, L, d)
    (_, S), _ = gated_delta_rule_forward(K, K, V, np.asarray(g)[None, None], np.asarray(beta)[None, None], scale=1.0)
    return S[0, 0]


def _half_step() -> np.ndarray:
    """S_2ᵀk after writing [1, 0] then [0, 1] at the same unit key with β = 1/2, g = 0 (the key: any unit vector)."""
    k = np.array([0.6, 0.8])
    S = _delta_final_state([k, k], [[1.0, 0.0], [0.0, 1.0]], np.zeros(2), np.full(2, 0.5))
    return S.T @ k  # (d_v, d_k) @ (d_k,)


def _decay_entry() -> float:
    """A[4, 1] of the delta rule with orthonormal keys, β = 1, g = −0.5 and q_4 = k_1: read off the recurrence with
    the identity as the values (o_4 = row 4 of A)."""
    keys = np.eye(5)  # (L, d_k): orthonormal
    q = np.zeros((5, 5))
    q[4] = keys[1]
    Q, K, V = (a[None, None] for a in (q, keys, np.eye(5)))  # (1, 1, 5, 5)
    (o, _), _ = gated_delta_rule_forward(Q, K, V, np.full((1, 1, 5), -0.5), np.ones((1, 1, 5)), scale=1.0)
    return float(o[0, 0, 4, 1])


def _state_floats() -> int:
    """The floats of GatedDeltaNet's decoding state (B = 1) at Qwen3-Next-80B-A3B's linear-layer sizes (16 key heads,
    32 value heads, 128 dims each, conv kernel 4): its zero state's arrays. The hidden size (8 here, 2048 in the model)
    sizes only the projections."""
    state = GatedDeltaNet(8, 16, 32, 128, 128, conv_kernel_size=4).zero_state(1)
    return int(state.conv.size + state.recurrent.size)


def _interleave_order() -> np.ndarray:
    """The order in which ``rope_interleaved_forward`` gathers a head's features into halves (pair i at (i, i + 4)),
    read off its output at position 0 (no turn) for the features numbered 0 ... 7."""
    out, _ = F.rope_interleaved_forward(np.arange(8.0)[None, None, None, :], np.array([0]))  # (1, 1, 1, 8)
    return out.ravel().astype(int)


def _yarn_scores() -> list[float]:
    """[YaRN's attention factor at factor 16, q·k turned with it / q·k turned by the same table with factor 1]."""
    scaling = RS.check_rope_scaling({"rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 4096})
    inv_freq, factor = RS.rope_frequencies(scaling, 10000.0, 64)
    q, k = np.random.default_rng(0).standard_normal((2, 1, 1, 1, 64))  # (1, 1, 1, 64) each

    def score(f):
        rq, _ = F.rotary_forward(q, np.array([5000]), inv_freq, f)
        rk, _ = F.rotary_forward(k, np.array([3000]), inv_freq, f)
        return float(rq.ravel() @ rk.ravel())

    return [factor, score(factor) / score(1.0)]


def _llama3_pairs() -> tuple[int, int, int]:
    """(kept, mixed, divided) pairs of Llama 3.1's table (d = 128, θ = 500000, N = 8192, factor 8, low 1, high 4)."""
    fields = {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192,
              "low_freq_factor": 1.0, "high_freq_factor": 4.0}  # fmt: skip
    scaled, _ = RS.rope_frequencies(RS.check_rope_scaling(fields), 500000.0, 128)
    ratio = scaled / RS.default_frequencies(500000.0, 128)  # (64,): 1, between, or 1/8
    kept, divided = int(np.isclose(ratio, 1.0, rtol=1e-12).sum()), int(np.isclose(ratio, 1 / 8, rtol=1e-12).sum())
    return kept, ratio.size - kept - divided, divided


def _topk_keys() -> np.ndarray:
    """Query 4's keys by ``topk_select`` (k = 2, causal over 7 keys) for the scores [3, 1, 3, 2, 3, 9, 9]."""
    scores = np.tile([3.0, 1.0, 3.0, 2.0, 3.0, 9.0, 9.0], (7, 1))[None]  # (1, 7, 7): every query the same row
    return topk_select(scores, 2, np.tri(7, dtype=bool))[0, 4]  # (2,)


def _loss_grad() -> np.ndarray:
    """∂KL(p ‖ softmax(I))/∂I for I = [0, 0, ln 2], p = [1/2, 1/2, 0], by the library's loss backward."""
    I, p = np.array([[[0.0, 0.0, np.log(2.0)]]]), np.array([[[0.5, 0.5, 0.0]]])  # noqa: E741  (1, 1, 3)
    return indexer_loss_backward(1.0, indexer_loss_forward(I, p)[1])[0, 0]


def _selected_scores() -> int:
    """The slots holding a key in causal top-3 selection over L = 8."""
    return int((topk_select(np.zeros((1, 8, 8)), 3, np.tri(8, dtype=bool)) >= 0).sum())


def _ssd_decay_entry() -> float:
    """exp(segsum(A·Δ))[3, 1] for A = −0.5, Δ = [1, 2, 0.5, 1, 3]: SSD's matrix with B = C = 1 (N = 1) is the decay
    mask times Δ_j, so M[3, 1] / Δ_1."""
    dt = np.array([1.0, 2.0, 0.5, 1.0, 3.0])
    ones = np.ones((1, 1, 5, 1))  # B = C: (1, G, L, N = 1)
    M, _ = ssd_matrix_forward(dt[None, None], np.array([-0.5]), ones, ones)
    return float(M[0, 0, 3, 1] / dt[1])


def _ssd_block_rank() -> int:
    """The rank of M[16:24, 0:8] for random B, C (N = 3) and Δ > 0 on 24 tokens (seeded)."""
    rng = np.random.default_rng(0)
    B, C = rng.standard_normal((2, 1, 1, 24, 3))  # (1, 1, L, N) each
    M, _ = ssd_matrix_forward(rng.uniform(0.1, 1.0, (1, 1, 24)), np.array([-0.3]), B, C)
    return int(np.linalg.matrix_rank(M[0, 0, 16:24, 0:8]))


def _mamba2_state_bytes() -> int:
    """The bytes of Mamba2Mixer's decoding state (B = 1, float64) for notebook 18's sizes: its zero state's arrays."""
    state = Mamba2Mixer(64, 4, 32, 16, n_groups=1, conv_kernel_size=4).zero_state(1)
    return int(state.conv.nbytes + state.recurrent.nbytes)
