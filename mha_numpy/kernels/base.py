"""The kernel protocol, the preamble every kernel shares, and the contract of a kernel's cache.

A kernel computes softmax(mods(q kᵀ · scale + bias) + mask) v on (B, H, L, d) arrays, and its backward:

    context, cache = kernel.forward(q, k, v, mask=None, scale=None, dropout_p=0.0, rng=None,
                                    dropout_mask=None, bias=None, score_mods=(), sinks=None)
    dq, dk, dv, d_bias, d_sinks = kernel.backward(d_context, cache)  # d_bias, d_sinks: None when not given
    dq, dk, dv, d_bias, d_sinks = kernel.backward(d_context, cache, d_lse=d_lse)  # when cache.lse is used

The backward returns one gradient per differentiable input of the forward (q, k, v, bias, sinks), None for one
that was not given. ``sinks`` (H,): one learned logit per head that joins every row's softmax denominator, an
attention sink that takes weight and gives no value (gpt-oss): P_ij = exp(S_ij) / (exp(sink_h) + Σ_k exp(S_ik)).
No scale, bias, score mod or mask reaches it (gpt-oss appends it after the mask); a fully masked row gives all its
weight to the sink (zero weights, zero context); a sink of -inf is no sink. Every kernel holds it natively: the
chunked kernel starts each row's running max and sum from it (m = sink, ℓ = 1), nothing of size Lq × Lk is made.

``forward`` checks its arguments once (``check_qkv`` and ``check_args``) and calls ``run``, which
a kernel implements on checked arguments; ``MultiHeadAttention`` checks early (before any arithmetic)
and calls ``run`` itself. ``score_mods`` are elementwise changes of the scores (``ScoreMod``, e.g. a
soft-cap), applied in order after the bias and before the mask, on whatever block of scores a kernel
holds (the whole tensor, one head, one tile). A mask may be a ``masks.StructuredMask`` (a bool mask given by
its rule): a kernel that holds whole score tensors builds its entries (``np.asarray(mask)``: the vectorized and
the naive kernels do), a tiled one asks the rule for its tiles (the chunked kernel).

The cache contract (``CACHE_ATTRIBUTES``; ``tests/test_kernels.py`` checks it for every registered kernel):
every kernel's cache has

    kernel          the kernel that made it (set when the cache is made), so a backward never dispatches on a name
    scores          (B, H, Lq, Lk) mods(q kᵀ · scale + bias), before the mask
    masked_scores   (B, H, Lq, Lk) after the mask (-inf where a bool mask blocks)
    attn_weights    (B, H, Lq, Lk) after softmax, before dropout; fully masked rows are 0. With sinks, the keys'
                    weights only: a row sums to 1 - its sink's weight (gpt-oss drops the sink's column too)
    dropout_mask    (B, H, Lq, Lk) bool keep-mask used by dropout, or None
    lse             (B, H, Lq) float64, each row's log-sum-exp log Σ_j exp(masked score_ij), the log of the
                    softmax's denominator (attn_weights = exp(masked_scores - lse)); -inf for a fully masked row.
                    With sinks the sink counts, lse = log(exp(sink) + Σ_j exp(S_ij)): the sink is a key of value
                    0, so O = Σ_j exp(S_ij - lse) V_j still holds (merging partial results, give it to one part)

The log-sum-exp is FlashAttention's convention (natural log, per row), what merges attention computed over
disjoint sets of keys. It is float64 whatever the working dtype: kernels keep the row max m and the sum ℓ apart
and form m + log ℓ at the end, in float64 (beside a large m, a float32 lse would lose log ℓ). When a loss uses
it, ``backward(d_context, cache, d_lse=...)`` takes its gradient (B, H, Lq) too: ∂ lse_i / ∂ s_ij = P_ij, so d_lse
joins the softmax's row term, dS = P ∘ (dP - (D - d_lse)).

A kernel may compute the five arrays only when they are read (the chunked kernel does: they are Lq × Lk,
the memory it exists to avoid); reading one never changes what ``backward`` returns.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

import numpy as np

from .._checks import as_generator, check_dropout, check_mask, check_qkv, default_scale
from ..masks import StructuredMask

CACHE_ATTRIBUTES = ("kernel", "scores", "masked_scores", "attn_weights", "dropout_mask", "lse")


@dataclass(frozen=True, eq=False)
class ScoreMod:
    """A change of the scores, the kernels' one hook: torch FlexAttention's ``score_mod``, with its parameters.

    mod(score, b, h, q_idx, kv_idx, **params) -> score'    on any block of scores a kernel holds (the whole
        (B, H, Lq, Lk) tensor, one head's (Lq, Lk), one tile), with ``b``, ``h``, ``q_idx``, ``kv_idx`` integer
        arrays (or ints) broadcastable to the block: the block's own batch items, heads, queries and keys
    vjp(score, b, h, q_idx, kv_idx, d_out, **params) -> (d_score, {name: d_param})    its vector-Jacobian
        product at ``score`` (the mod's input), ``d_param`` with the shape of ``params[name]`` (only the learned
        ones; a block's share: a kernel sums them over its blocks)
    params: {name: array} the arrays the mod reads (a bias table, a slope or temperature per head), passed by
        keyword. A kernel's backward returns their gradients in ``AttentionGrads.score_params[name]``.

    A score term with parameters (a relative-position table, ALiBi, a learned temperature) and an elementwise
    change (a soft-cap) are the same thing here: a step adds its ``ScoreMod`` to the call (``AttentionArgs``), no
    kernel knows it. ``ScoreMod.elementwise`` wraps a ``functional`` pair ``forward(s) -> (s', cache)`` /
    ``backward(ds', cache) -> ds`` (0.3's form).
    """

    name: str
    mod: Callable
    vjp: Callable
    params: Mapping = field(default_factory=dict)

    def __call__(self, score, b, h, q_idx, kv_idx):
        return self.mod(score, b, h, q_idx, kv_idx, **self.params)

    def backward(self, score, b, h, q_idx, kv_idx, d_out):
        """-> (d_score, {name: d_param}): ``vjp`` with this mod's parameters."""
        return self.vjp(score, b, h, q_idx, kv_idx, d_out, **self.params)

    @classmethod
    def elementwise(cls, name: str, forward: Callable, backward: Callable) -> ScoreMod:
        """A ScoreMod from an elementwise pair (``functional.soft_cap_forward`` / ``_backward`` with its options
        bound), which reads no index and has no parameters."""

        def vjp(score, b, h, q_idx, kv_idx, d_out):
            return backward(d_out, forward(score)[1]), {}  # the pair's backward at the block's own cache

        return cls(name, lambda score, b, h, q_idx, kv_idx: forward(score)[0], vjp)


def add_score_params(total: dict, part: dict) -> dict:
    """Add one block's score-mod parameter gradients ``part`` into ``total`` (both {mod: {param: gradient}}); ->
    total. A kernel sums its blocks' shares in a fixed order, so the result does not depend on its threads."""
    for mod, grads in part.items():
        into = total.setdefault(mod, {})
        for name, g in grads.items():
            into[name] = g.copy() if name not in into else into[name] + g
    return total


class AttentionGrads(tuple):
    """What a kernel's backward returns: ``(dq, dk, dv, d_bias, d_sinks)``, one gradient per differentiable input
    (None for an input not given, always five, as in 0.3), and ``score_params``: each score mod's parameter
    gradients by name, {mod name: {param name: gradient}} (empty without such mods).

    ``AttentionGrads(..., score_params=d, score_mods=mods)`` gives every parameter of ``mods`` a gradient: zeros
    for one no block reached (no key at all), so a caller never finds None where a parameter was given."""

    def __new__(cls, dq, dk, dv, d_bias=None, d_sinks=None, score_params=None, score_mods=()):
        grads = super().__new__(cls, (dq, dk, dv, d_bias, d_sinks))
        grads.score_params = {} if score_params is None else score_params
        for mod in score_mods:
            for name, p in mod.params.items():
                grads.score_params.setdefault(mod.name, {}).setdefault(name, np.zeros_like(p))
        return grads


@dataclass(frozen=True)
class AttentionArgs:
    """The checked arguments of one attention call (shapes broadcast to (B, H, Lq, Lk)).

    mask: None, bool (True = may attend), float (added) or a ``masks.StructuredMask`` (bool, given by its rule: the
    chunked kernel classifies its tiles from the rule, the others build its entries).
    bias: None or float (added, differentiable).
    dropout_p: in [0, 1).   keep: a given bool keep-mask (B, H, Lq, Lk), or None.   rng: draws the rest.
    score_mods: ``ScoreMod`` s applied in order after the bias, before the mask.
    sinks: None or (H,) float, each head's sink logit in every row's softmax denominator (differentiable).
    key_index: None, or (Lk,) the keys' own indices (the score mods' ``kv_idx``) when a kernel runs on a subset of
    the keys (``SplitKVKernel``'s shards); None: 0 ... Lk - 1.
    """

    shape: tuple[int, int, int, int]
    scale: float
    mask: np.ndarray | None = None
    bias: np.ndarray | None = None
    dropout_p: float = 0.0
    keep: np.ndarray | None = None
    rng: np.random.Generator | None = None
    score_mods: tuple = ()
    sinks: np.ndarray | None = None
    key_index: np.ndarray | None = None

    def add_bias(self, term: np.ndarray) -> AttentionArgs:
        """These arguments with ``term`` (broadcastable to the scores) added to the bias."""
        return replace(self, bias=term if self.bias is None else self.bias + term)

    def add_score_mod(self, mod: ScoreMod) -> AttentionArgs:
        """These arguments with one more change of the scores (a ``ScoreMod``), applied after the others."""
        return replace(self, score_mods=(*self.score_mods, mod))

    def index(self, b, h, rows, cols) -> tuple:
        """The score mods' indices of a block: batch items ``b``, heads ``h``, query rows and key columns (each an
        int or a 1-D array) -> (b, h, q_idx, kv_idx) broadcastable to a (len b, len h, rows, cols) block (an int
        axis stays an int, and drops out of the block's shape)."""
        cols = np.asarray(cols) if self.key_index is None else self.key_index[cols]  # the keys' own indices
        axes = [np.asarray(b), np.asarray(h), np.asarray(rows), cols]
        n = sum(a.ndim for a in axes)  # the block's number of axes
        out, at = [], 0
        for a in axes:  # each 1-D axis to its place among the block's axes: (·, 1, 1), (1, ·, 1), ...
            out.append(a if a.ndim == 0 else a.reshape((1,) * at + (-1,) + (1,) * (n - at - 1)))
            at += a.ndim
        return tuple(out)

    def with_sinks(self, sinks: np.ndarray) -> AttentionArgs:
        """These arguments with each head's sink logit (H,) in the softmax's denominator."""
        return replace(self, sinks=sinks)

    def append_keys(self, length: int, n: int) -> AttentionArgs:
        """For n keys appended after the ``length`` there are (torch's ``add_bias_kv``, ``add_zero_attn``): every
        query may attend to them (the mask gets n allowed columns) and no bias reaches them (n zero columns)."""

        def extend(a, fill):
            if a is None:
                return None
            a = a.reshape((1,) * (4 - a.ndim) + a.shape)  # (b, h, lq, lk), lk = length or 1 (broadcast)
            a = np.broadcast_to(a, (*a.shape[:3], length))  # (b, h, lq, length): the keys so far, explicitly
            tail = np.full((*a.shape[:3], n), fill, dtype=a.dtype)  # (b, h, lq, n)
            return np.concatenate([a, tail], axis=-1)  # (b, h, lq, length + n)

        if isinstance(self.mask, StructuredMask):
            return replace(self, mask=self.mask.append_keys(n), bias=extend(self.bias, 0.0))
        allowed = True if self.mask is not None and self.mask.dtype == np.bool_ else 0.0
        return replace(self, mask=extend(self.mask, allowed), bias=extend(self.bias, 0.0))

    @property
    def dropout(self) -> bool:
        """Whether the call drops weights (a given keep-mask, or p > 0)."""
        return self.keep is not None or self.dropout_p > 0.0

    def keep_mask(self) -> np.ndarray | None:
        """The whole (B, H, Lq, Lk) keep-mask: the given one, or drawn now as ``dropout_forward`` draws it."""
        if self.keep is not None or self.dropout_p == 0.0:
            return self.keep
        return self.rng.random(self.shape) >= self.dropout_p  # (B, H, Lq, Lk) True = keep

    def seed(self) -> int | None:
        """A seed for kernels that draw their keep-mask tile by tile (None without sampled dropout)."""
        if self.keep is not None or self.dropout_p == 0.0:
            return None
        return int(self.rng.integers(2**63))


def check_args(
    shape, head_dim: int, mask=None, scale=None, dropout_p=0.0, rng=None, dropout_mask=None, bias=None,
    score_mods=(), dtype=None, mask_keys=None, sinks=None,
):  # fmt: skip
    """Validate everything but q, k, v for scores of ``shape`` = (B, H, Lq, Lk) -> AttentionArgs.

    dtype: the dtype of q, k, v. A bias of another dtype is refused (it is differentiated: its gradient would
    come back in another dtype than it has); a float mask of another dtype is converted to it (a mask is not).
    mask_keys: the keys the mask covers when keys are appended after them (``MultiHeadAttention``'s
    ``add_bias_kv``, ``add_zero_attn``), default all Lk. sinks: None or (H,) float in ``dtype`` (differentiated).
    """
    shape = tuple(int(n) for n in shape)
    mask_shape = shape if mask_keys is None else (*shape[:3], int(mask_keys))
    if isinstance(mask, StructuredMask):  # its rule is kept: its entries are never checked, nor built here
        if mask.shape[2:] != mask_shape[2:] or mask.batch not in (1, shape[0]) or mask.shape[1] not in (1, shape[1]):
            raise ValueError(f"mask is a StructuredMask of shape {mask.shape}; the scores' (B, H, Lq, Lk) = "
                             f"{mask_shape} need (1 or B, 1, Lq, Lk) exactly (a BlockMask: 1 or H heads)")  # fmt: skip
    else:
        mask = check_mask(mask, mask_shape)
    bias = check_mask(bias, shape, name="bias", allow_bool=False, dtype=dtype)
    if sinks is not None:
        sinks = check_mask(sinks, (shape[1],), name="sinks", allow_bool=False, dtype=dtype)
        if sinks.shape != (shape[1],):
            raise ValueError(f"sinks with shape {sinks.shape} must be (H,) = ({shape[1]},): one logit per head")
    if dtype is not None and mask is not None and mask.dtype != np.bool_ and mask.dtype != dtype:
        with np.errstate(over="ignore"):  # float64's finfo.min becomes float32's -inf: still "blocked"
            mask = mask.astype(dtype)
    if not all(isinstance(m, ScoreMod) for m in score_mods):
        raise ValueError(f"score_mods must be kernels.ScoreMod objects, got {score_mods!r:.80}")
    keep = check_dropout(shape, dropout_p, rng, dropout_mask)
    rng = None if rng is None else as_generator(rng)
    scale = default_scale(head_dim, scale)
    return AttentionArgs(shape, scale, mask, bias, float(dropout_p), keep, rng, tuple(score_mods), sinks)


class Kernel:
    """Base of every kernel: ``forward`` = checks + ``run``; subclasses implement ``run`` and ``backward``."""

    name = "kernel"
    score_arrays = 3  # (B, H, Lq, Lk) arrays a call's cache keeps (scores, masked scores, weights): flow.kept_bytes
    default_memory_budget = None  # bytes a module's call may keep for its backward before it recomputes (None: any)

    def forward(
        self, q, k, v, mask=None, scale=None, dropout_p=0.0, rng=None, dropout_mask=None, bias=None, score_mods=(),
        sinks=None,
    ):  # fmt: skip
        """q (B, H, Lq, d), k (B, H, Lk, d), v (B, H, Lk, dv) -> context (B, H, Lq, dv), cache."""
        q, k, v = check_qkv(q, k, v)
        shape = (q.shape[0], q.shape[1], q.shape[2], k.shape[2])
        args = check_args(shape, q.shape[-1], mask, scale, dropout_p, rng, dropout_mask, bias, score_mods, q.dtype,
                          sinks=sinks)  # fmt: skip
        return self.run(q, k, v, args)

    def run(self, q, k, v, args: AttentionArgs):  # pragma: no cover - the protocol
        """The attention on checked arguments: q (B, H, Lq, d), k (B, H, Lk, d), v (B, H, Lk, dv) -> context, cache."""
        raise NotImplementedError

    def choose(self, shape) -> Kernel:
        """The kernel that runs a call with scores of ``shape`` (B, H, Lq, Lk): itself (``auto`` picks one)."""
        return self

    def matmul(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """a (N, K) @ b (K, M) for the module's projections around this kernel: on the threads its tiles use
        (``MultiHeadAttention`` passes it to ``functional.linear_*``). Here BLAS's own threads."""
        return a @ b  # (N, K) @ (K, M) -> (N, M)

    def backward(self, d_context, cache, d_lse=None):  # pragma: no cover - the protocol
        """d_context (B, H, Lq, dv) -> dq (B, H, Lq, d), dk (B, H, Lk, d), dv (B, H, Lk, dv), d_bias or None,
        d_sinks (H,) or None.

        d_lse: None, or (B, H, Lq) the gradient of ``cache.lse`` (float64 or the working dtype)."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"
