"""FlashAttention-style attention in NumPy: blocked, online softmax, memory O(L·block).

The vectorized path (``functional``) builds the whole score tensor (B, H, Lq, Lk): at L = 16384,
H = 4 in float32 that is 4 GiB for one tensor. Here a head's scores exist only one tile at a time.
Notation for one head: Q (Lq, d) already multiplied by ``scale``, K (Lk, d), V (Lk, dv); query
block i has rows Qᵢ (bq, d), key block j has rows Kⱼ, Vⱼ (bk, ·); Sᵢⱼ = Qᵢ Kⱼᵀ is a (bq, bk) tile.

Forward (``_forward_rows``), for each query block, walk the key blocks keeping per row a running
max m, a running sum ℓ and an unnormalised context A (online softmax):

    m' = max(m, rowmax Sᵢⱼ)      α = exp(m - m')      Pᵢⱼ = exp(Sᵢⱼ - m')
    ℓ' = α ℓ + rowsum Pᵢⱼ         A' = α A + Pᵢⱼ Vⱼ
    at the end:  Oᵢ = A / ℓ, and the row's m, ℓ and j* (the first key where m was reached) are kept:
    all the backward needs

m and ℓ are kept apart, not folded into lse = m + log ℓ as FlashAttention does: in the working
dtype, log ℓ is absorbed when |m| is large (a row blocked by a finite mask such as finfo.min, or
float32 logits of 1e4), and exp(S - lse) then gives weights that do not sum to 1. exp(S - m) / ℓ
is as exact as the plain softmax. The row's log-sum-exp (the cache contract's ``lse``) is formed once, at
the end, as m + log ℓ in float64.

Backward (``_backward_keys``) never stores P: it recomputes each tile Pᵢⱼ = exp(Sᵢⱼ - mᵢ) / ℓᵢ and,
with FlashAttention's row term D = rowsum(dO ∘ O) (one pass over (Lq, dv) arrays), gives

    dVⱼ += Pᵢⱼᵀ dOᵢ     dPᵢⱼ = dOᵢ Vⱼᵀ     dSᵢⱼ = Pᵢⱼ ∘ (dPᵢⱼ - Dᵢ)     dQᵢ += dSᵢⱼ Kⱼ     dKⱼ += dSᵢⱼᵀ Qᵢ

D equals the plain path's D' = Σⱼ Pᵢⱼ dPᵢⱼ (the softmax VJP's subtracted sum) in exact arithmetic only; the two
round differently, by some ε ~ u |dO| |V|, and every dSᵢⱼ inherits Pᵢⱼ ε. Where a row's weight sits on one key j*
(a saturated softmax) the exact dSᵢⱼ* vanishes with 1 - Pᵢⱼ* but Pᵢⱼ* ε does not, and dKⱼ* multiplies it by |Qᵢ|.
So a row whose top weight Pᵢⱼ* = 1 / ℓᵢ is at least 1/2 takes that entry from the others instead, since the VJP
of a softmax row sums to zero (Σⱼ Pᵢⱼ = 1):

    dSᵢⱼ* = -Σ_{j≠j*} dSᵢⱼ      (the tiles leave it out and sum the others; ``_add_pivots`` adds it at the end)

Its error, about (1 - Pᵢⱼ*) ε, vanishes with the saturation: a one-hot row gets dS = 0 exactly, as the plain path
does, and a nearly saturated one is more exact than the plain path, whose rounded D' errs like D
(docs/derivation.md § 13). When a loss also uses the lse, its gradient enters as D - d_lse in place of D (∂ lse_i /
∂ S_ij = P_ij), and a row's dS then sums to d_lse, not 0: the pivot entry is d_lse_i - Σ_{j≠j*} dS_ij (§ 23).

Attention sinks (``args.sinks``, one logit σ_h per head in every row's denominator, gpt-oss): each row starts
from its sink, m = σ_h and ℓ = exp(σ_h - m) = 1, before the first tile; a key's score must exceed σ_h to become
j*. The sink is one more entry of the row, of value 0 (D is unchanged: its dP is 0), with
dS_sink = P_sink (0 - D), P_sink = exp(σ_h - m) / ℓ, and the row's dS, the sink's included, sums to d_lse (to 0).
So a key's pivot entry is d_lse_i - Σ_{j≠j*} dS_ij - dS_sink. The sink itself needs no pivot: its dP is exactly
0, so its dS has no cancellation (dS_sink = -P_sink D, D = rowsum(dO ∘ O) ~ (1 - P_sink) |dO| |V|, rounded
relative to itself), even when the sink takes a row's whole weight. dσ_h = Σ over the head's rows of dS_sink.

Masks (bool True = may attend, or float added) are cut into the same tiles (a ``masks.StructuredMask``, given
by its rule, is never built: its ``classify`` gives most tiles' states, only a partial tile's entries are made,
and its ``key_range`` / ``query_range`` limit the tiles visited, so a window costs O(L · window)): a tile with no
allowed position is skipped entirely (so a causal mask skips the blocks above the diagonal), a
tile with every position allowed is not touched, and a tile with both is cut in four, and again,
down to 128 × 128 parts (``_Tiles.parts``): a causal diagonal tile costs little more than its lower
half. A row with no allowed key gets ℓ = 0 and 1/ℓ is stored as 0, which makes its recomputed
weights exactly 0: zero weights, zero context, zero (finite) gradients. A float ``bias`` (ALiBi, a
relative-position table) is added like a float mask, and its gradient, the sum of dS over the bias's
broadcast axes, is accumulated tile by tile. Score mods (``kernels.ScoreMod``: an elementwise change such
as a soft-cap) act on each tile after the bias and before the mask; the backward recomputes them with the
tile and takes dS back through their pair's backward before dQ, dK and the bias gradient.

Dropout (training): the keep-mask of a tile is either cut from a given ``dropout_mask`` or drawn
from its own generator seeded by (seed, b, h, i, j), so the backward regenerates exactly the same
tile without anything of size Lq × Lk being stored. ``cache.dropout_mask`` assembles it on request.

Parallelism: work items are (b, heads, query block) in the forward and (b, heads, key range) in the backward.
A head's dQ receives a contribution from every key block, so a backward item normally takes all the key
blocks of its heads; when there are fewer head groups than threads (B = 1 and one head, e.g. under
``MultiHeadAttention(recompute=True)``), each group's key blocks are cut into contiguous ranges with about
as many non-empty tiles each (FlashAttention-2's split): an item owns its range's dK, dV rows and sums its
share of dQ into a partial of its own (the first range into dQ itself), added to dQ at the end in a fixed
order, so the result does not depend on the threads. With ``num_threads`` > 1 the items run on a thread
pool (NumPy releases the GIL inside BLAS and ufuncs) and BLAS is limited to one thread meanwhile
(``mha_numpy.threads``), so the two levels do not oversubscribe.
With ``num_threads`` = 1 the items run in the calling thread and BLAS uses its own threads.
``attn_weights`` / ``scores`` of the cache are computed only when asked for (they are Lq × Lk).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import numpy as np

from .. import functional as F
from .._checks import check_d_context, check_d_lse, positive_int_or_none
from ..masks import EMPTY, FULL, MIXED, PARTIAL, StructuredMask
from ..threads import AVAILABLE_CORES, pooled_matmul, run_items
from .base import AttentionArgs, AttentionGrads, Kernel, add_score_params

# Both picked by measurement on the 2-core machine of docs/performance.md (block-size sweep there):
# big tiles amortise the ~15 NumPy calls (and their moments holding the GIL) per tile; the best was
# 512 × 512 in float32 and 256 × 256 in float64 (1 MiB and 512 KiB a tile). A pool of one thread per
# available core beats BLAS's own threading on these small (block × d) products.
DEFAULT_BLOCK_SIZE = {4: 512, 8: 256}  # by itemsize
DEFAULT_NUM_THREADS = AVAILABLE_CORES

_EMPTY, _FULL, _PARTIAL = EMPTY, FULL, PARTIAL  # a mask tile: nothing allowed / everything allowed / mixed
MIN_PART = 128  # the smallest side of a tile cut by ``_Tiles.parts``


# --------------------------------------------------------------------------- tiles


class _Tiles:
    """The mask, bias and dropout of a group of heads (b, hs), cut into (query block × key block) tiles.

    ``hs`` is a slice of heads that share their mask (``_group_size``), so a tile is skipped for all of them
    or for none; every array here has the group's heads as its first axis. A ``StructuredMask`` is kept as its
    rule (``self.rule``): a tile's state comes from the rule, and only a partial tile's entries are built.
    """

    def __init__(self, args: AttentionArgs, b: int, hs: slice, seed, states: dict):
        def view(a):
            return None if a is None else np.broadcast_to(a, args.shape)[b, hs]  # (g, Lq, Lk) view

        rule = isinstance(args.mask, StructuredMask)  # hs: one head when the heads do not share it
        self.rule = args.mask.head(hs.start) if rule else None
        self.mask = self.rule if self.rule is not None else view(args.mask)
        self.bias, self.keep = view(args.bias), view(args.keep)
        self.Lq, self.Lk = args.shape[2:]
        self.mods, self.args = args.score_mods, args
        self.sinks = None if args.sinks is None else args.sinks[hs]  # (g,) the heads' sink logits, or None
        self.p, self.seed, self.b, self.hs = args.dropout_p, seed, b, hs
        mshape = (1,) * (4 - np.ndim(args.mask)) + np.shape(args.mask)  # the mask's own (b, h, Lq, Lk) sizes
        self.states = states  # heads and batch items that share their mask share its tile states:
        self.key = (b if mshape[0] > 1 else 0, hs.start if mshape[1] > 1 else 0)  # the key of these heads' mask

    def mask_state(self, i0: int, i1: int, j0: int, j1: int):
        """-> (_EMPTY | _FULL | _PARTIAL, the (n, bk) mask tile or None), looked up before any work on the tile.

        Found once per tile of each distinct mask and remembered (forward and backward, every head sharing it).
        The heads of a group share their mask, so the first head's tile stands for all of them.
        """
        return self._lookup(i0, i1, j0, j1)[:2]

    def _lookup(self, i0, i1, j0, j1):
        """-> (state, mask tile or None, mixed: the tile has blocked and allowed positions), remembered."""
        if self.mask is None:
            return _FULL, None, False
        key = (*self.key, i0, i1, j0, j1)
        found, m = self.states.get(key), None
        if found is None:
            state = _PARTIAL if self.rule is None else self.rule.classify(self.b, i0, i1, j0, j1)  # the rule: O(1)
            mixed = state == MIXED  # certainly both: no entry need be looked at
            state = _PARTIAL if mixed else state
            if state == _PARTIAL and not mixed:  # perhaps both: the entries tell
                m = self._entries(i0, i1, j0, j1)
                blocked = ~m if m.dtype == np.bool_ else np.isneginf(m)
                nothing, something = blocked.all(), blocked.any()
                state = _EMPTY if nothing else (_FULL if m.dtype == np.bool_ and not something else _PARTIAL)
                mixed = something and not nothing
            found = self.states[key] = (state, mixed)  # one dict item set: thread-safe
        state, mixed = found
        if state == _PARTIAL and m is None:
            m = self._entries(i0, i1, j0, j1)
        return state, (m if state == _PARTIAL else None), mixed

    def _entries(self, i0: int, i1: int, j0: int, j1: int) -> np.ndarray:
        """The (i1 - i0, j1 - j0) mask tile: a view of the array, or built from the rule."""
        return self.mask[0, i0:i1, j0:j1] if self.rule is None else self.rule.tile(self.b, i0, i1, j0, j1)

    def key_blocks(self, i0: int, i1: int, bk: int) -> list[int]:
        """The first keys j0 (multiples of bk) of the key blocks that may hold an allowed key for the queries
        i0 ... i1 - 1: all of them for an array mask; a structured one's ``key_tiles`` (its ``key_range`` and
        appended keys; a ``BlockMask``'s listed blocks), so a window's query block visits O(window / bk) tiles
        instead of Lk / bk."""
        if self.rule is None:
            return list(range(0, self.Lk, bk))
        return self.rule.key_tiles(self.b, i0, i1, bk)

    def query_blocks(self, j0: int, j1: int, bq: int) -> list[int]:
        """The first queries i0 (multiples of bq) of the query blocks that may attend to a key j0 ... j1 - 1: none
        when no query does (a negative diagonal leaves the last keys unseen; their dK, dV rows stay 0)."""
        if self.rule is None:
            return list(range(0, self.Lq, bq))
        return self.rule.query_tiles(self.b, j0, j1, bq)

    def parts(self, i0: int, i1: int, j0: int, j1: int):
        """The rectangles of the tile [i0, i1) × [j0, j1) that need work: (r0, r1, c0, c1, state, mask tile).

        A tile holding both blocked and allowed positions (a causal mask's diagonal, a window's edge) is cut
        in four, each looked up again, down to ``MIN_PART`` rows or columns: a quarter with nothing allowed is
        skipped and a fully allowed one computed without the mask. On a causal diagonal this skips a quarter
        of the tile at the first cut and most of the rest below. Not with sampled dropout, whose keep-mask is
        drawn per whole tile.
        """
        state, mtile, mixed = self._lookup(i0, i1, j0, j1)
        if state == _EMPTY:
            return  # nothing allowed here: not even the product is computed
        if not mixed or self.seed is not None or min(i1 - i0, j1 - j0) < 2 * MIN_PART:
            yield i0, i1, j0, j1, state, mtile
            return
        im, jm = (i0 + i1) // 2, (j0 + j1) // 2
        for r0, r1 in ((i0, im), (im, i1)):
            for c0, c1 in ((j0, jm), (jm, j1)):
                yield from self.parts(r0, r1, c0, c1)

    def finish_scores(self, s: np.ndarray, i0: int, j0: int, state: int, m) -> list:
        """Add the bias, apply the score mods, then a _PARTIAL mask tile m (n, bk), to the score tile
        s = S[:, i0:, j0:] (g, n, bk), in place. -> the mods' caches (for the backward; [] without mods)."""
        i1, j1 = i0 + s.shape[-2], j0 + s.shape[-1]
        if self.bias is not None:
            np.add(s, self.bias[:, i0:i1, j0:j1], out=s, casting="unsafe")  # the same order as the vectorized path
        mods = []
        if self.mods:
            heads, rows, cols = np.arange(self.hs.start, self.hs.stop), np.arange(i0, i1), np.arange(j0, j1)
            index = self.args.index(self.b, heads, rows, cols)  # (b, h, q_idx, kv_idx) of the tile
            out, mods = F.score_mods_forward(s.copy(), self.mods, index)  # (g, n, bk); a copy: s is reused in place
            s[...] = out
        if state == _PARTIAL:
            if m.dtype == np.bool_:
                np.copyto(s, -np.inf, where=~m)  # (g, n, bk), the mask tile broadcast over the group's heads
            else:
                np.add(s, m, out=s, casting="unsafe")
        return mods

    def keep_tile(self, i0: int, i1: int, j0: int, j1: int):
        """Dropout keep-mask of the tile (bool, (g, i1 - i0, j1 - j0)), or None without dropout.

        A sampled tile comes from its own generator seeded by (seed, b, h, i0, j0), head by head, so it does
        not depend on how heads are grouped."""
        if self.keep is not None:
            return self.keep[:, i0:i1, j0:j1]
        if self.seed is None:
            return None
        heads = range(*self.hs.indices(1 << 62))
        draws = [np.random.default_rng((self.seed, self.b, h, i0, j0)).random((i1 - i0, j1 - j0)) for h in heads]
        return np.stack(draws) >= self.p


# --------------------------------------------------------------------------- one query block, forward


def _forward_rows(
    q, k, v, scale: float, tiles: _Tiles, i0: int, bk: int, out, m_out, inv_ell_out, jstar_out, lse_out
) -> None:
    """Online softmax of one query block against all key blocks, for a group of g heads at once.

    q: (g, n, d) queries, rows i0 ... i0 + n - 1   k: (g, Lk, d)   v: (g, Lk, dv)   (any strides)
    writes out: (g, n, dv) the context rows, m_out: (g, n) the row max, inv_ell_out: (g, n) 1 / row sum
    (0 for a row where nothing is allowed), jstar_out: (g, n) j*, the first key of the largest score
    (-1 for a row where nothing is allowed) and lse_out: (g, n) float64 m + log ℓ (-inf where nothing is allowed).
    """
    (g, n, _), Lk, dv, dt = q.shape, k.shape[1], v.shape[2], q.dtype
    dropout = tiles.keep is not None or tiles.seed is not None
    q = q * scale  # (g, n, d) the block's scaled queries: no tile is rescaled
    # Without dropout ℓ rides along as an extra column of V: [A, ℓ] += P [V, 1] (no separate row-sum pass).
    # With dropout the product uses the dropped weights while ℓ sums the undropped ones: ℓ is summed apart.
    va = v if dropout else np.concatenate([v, np.ones((g, Lk, 1), dtype=dt)], axis=2)  # (g, Lk, dv [+ 1])
    m = np.full((g, n), -np.inf, dtype=dt)  # running row max
    jstar = np.full((g, n), -1, dtype=np.intp)  # the key where the running max was first reached
    acc = np.zeros((g, n, va.shape[2]), dtype=dt)  # running unnormalised context Σ exp(s - m) v [and ℓ]
    ell = np.zeros((g, n), dtype=dt) if dropout else acc[..., dv]  # running row sum of exp(s - m)
    if tiles.sinks is not None:  # every row starts from its head's sink: m = σ, ℓ = exp(σ - m) = 1 (0: no sink)
        m[...] = tiles.sinks[:, None]  # (g, n); a key's score must exceed σ to become j*
        ell[...] = np.where(np.isneginf(m), 0.0, 1.0)  # (g, n); a view of acc's last column without dropout
    buf = np.empty((g, n, min(bk, Lk)), dtype=dt)  # the score tile, reused
    scale_drop = 1.0 / (1.0 - tiles.p) if tiles.p > 0 else 1.0
    for j0 in tiles.key_blocks(i0, i0 + n, bk):  # every key block (a structured mask: those it may allow)
        for r0, r1, c0, c1, state, mtile in tiles.parts(i0, i0 + n, j0, min(j0 + bk, Lk)):
            rows = slice(r0 - i0, r1 - i0)  # the part's rows within the block
            s = buf[:, : r1 - r0, : c1 - c0]
            np.matmul(q[:, rows], k[:, c0:c1].swapaxes(1, 2), out=s)  # (g, n, d) @ (g, d, bk) -> (g, n, bk), scale in q
            tiles.finish_scores(s, r0, c0, state, mtile)
            m_old = m[:, rows]  # (g, n)
            top = s.argmax(axis=2)  # (g, n) the part's first key of largest score (a NaN counts as largest)
            s_top = np.take_along_axis(s, top[..., None], axis=2)[..., 0]  # (g, n) the part's row max
            np.copyto(jstar[:, rows], top + c0, where=s_top > m_old)  # a new max moves j* here; a tie keeps the first
            m_new = np.maximum(m_old, s_top)  # (g, n); stays -inf while a row has had nothing allowed (were it set
            # to 0, a later key scoring below 0 would not become j*, and one below -745 would give ℓ = 0: no context)
            shift = m_new.copy()  # (g, n) what the part is shifted by: m', or 0 for such a row (exp(-inf) = 0)
            shift[np.isneginf(shift)] = 0.0
            alpha = np.exp(m_old - shift)  # (g, n) rescales what was summed with the old max
            np.subtract(s, shift[..., None], out=s)
            np.exp(s, out=s)  # (g, n, bk) P tile, not yet normalised
            acc[:, rows] *= alpha[..., None]  # (g, n, dv [+ 1]); without dropout this rescales ℓ too
            if dropout:
                ell[:, rows] *= alpha
                ell[:, rows] += s.sum(axis=2)
                s *= tiles.keep_tile(r0, r1, c0, c1)  # dropout acts on the weights after the softmax, not on ℓ
                s *= scale_drop
            acc[:, rows] += s @ va[:, c0:c1]  # (g, n, bk) @ (g, bk, dv [+ 1]) -> (g, n, dv [+ 1])
            m[:, rows] = m_new
    with np.errstate(divide="ignore"):  # log 0 = -inf for a row with nothing allowed
        lse_out[...] = m + np.log(ell.astype(np.float64))  # (g, n) in float64: log ℓ is not absorbed by a large m
    inv_ell = np.divide(1.0, ell, out=np.zeros_like(ell), where=ell != 0)  # (g, n); rows with nothing allowed: 0
    np.multiply(acc[..., :dv], inv_ell[..., None], out=out)  # (g, n, dv); rows with nothing allowed stay 0
    m_out[...] = np.where(np.isneginf(m), 0.0, m)
    inv_ell_out[...] = np.where(np.isnan(ell), np.nan, inv_ell)  # a NaN row stays NaN
    jstar_out[...] = jstar


# --------------------------------------------------------------------------- one head, backward


@dataclass
class _HeadRows:
    """What every key range of a group of g heads reads in the backward (made once per group, read-only).

    q: (g, Lq, d) the scaled queries, as the forward's tiles saw them   k: (g, Lk, d)   v: (g, Lk, dv)
    da: (g, Lq, dv + 1) = [dO, -D] / ℓ, each row divided by its ℓ (with dropout dO / ℓ alone, (g, Lq, dv))
    D_l: (g, Lq) D / ℓ   m: (g, Lq) the forward's row max
    pivot: (g, Lq) j* of the rows whose entry dS_ij* is found from the others (P_ij* ≥ 1/2), -1 for the other rows
    """

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    da: np.ndarray
    D_l: np.ndarray
    m: np.ndarray
    pivot: np.ndarray
    tiles: _Tiles

    @classmethod
    def make(cls, q, k, v, scale, d_out, m, inv_ell, D, pivot, tiles: _Tiles) -> _HeadRows:
        (g, Lq, dv), dropout = d_out.shape, tiles.keep is not None or tiles.seed is not None
        D_l = D * inv_ell  # (g, Lq)
        da = np.empty((g, Lq, dv if dropout else dv + 1), dtype=d_out.dtype)  # dropout scales dP before D goes
        np.multiply(d_out, inv_ell[..., None], out=da[..., :dv])  # (g, Lq, dv) dO / ℓ
        if not dropout:
            np.negative(D_l, out=da[..., dv])  # the extra column -D / ℓ
        return cls(q * scale, k, v, da, D_l, m, pivot, tiles)  # q * scale: (g, Lq, d)


def _backward_keys(r: _HeadRows, bq: int, bk: int, j_start: int, j_stop: int, dq, dk, dv, d_bias, row_sum, d_params):
    """Backward of a group of g heads over the key rows j_start ... j_stop - 1, tile by tile, recomputing
    P = exp(S - m) / ℓ (FlashAttention-2 order: key blocks outer, so dK, dV rows are finished in place).

    writes dq: (g, Lq, d) (this key range's share of the gradient w.r.t. the scaled q), and the key range's rows
    of dk: (g, Lk, d), dv: (g, Lk, dv); all start at 0; d_bias: None or the (g, Lq, Lk) gradient of the group's
    bias, this key range's columns (starts at 0), and row_sum: (g, Lq) Σ dS_ij over this range's keys j ≠ j* of the
    rows with a pivot (starts at 0): their entries dS_ij* are left out of the tiles and added by ``_add_pivots``;
    d_params: {mod: {param: gradient}} receives the score mods' parameter gradients of these tiles (starts empty).
    The 1/ℓ of each row rides along in the rows of [dO, -D] / ℓ: with E = exp(S - m) (so P = E / ℓ), one GEMM
    gives (dP - D) / ℓ = ([dO, -D] / ℓ) [v, 1]ᵀ, then dS = E ∘ (dP - D) / ℓ = P ∘ (dP - D) and dV = Eᵀ (dO / ℓ):
    nothing of size (bq, bk) is divided by ℓ.
    """
    (g, Lq, _), dt, tiles, n_dv = r.q.shape, r.q.dtype, r.tiles, r.v.shape[2]
    dropout = tiles.keep is not None or tiles.seed is not None
    scale_drop = 1.0 / (1.0 - tiles.p) if tiles.p > 0 else 1.0
    e_buf = np.empty((g, min(bq, Lq), min(bk, j_stop - j_start)), dtype=dt)
    dp_buf = np.empty_like(e_buf)
    for j0 in range(j_start, j_stop, bk):
        j1 = min(j0 + bk, j_stop)
        kb, vb = r.k[:, j0:j1], r.v[:, j0:j1]  # (g, bk, d), (g, bk, dv)
        if not dropout:
            vb = np.concatenate([vb, np.ones((g, j1 - j0, 1), dtype=dt)], axis=2)  # (g, bk, dv + 1) [v, 1]
        for i0 in tiles.query_blocks(j0, j1, bq):  # every query block (a structured mask: those it may allow)
            for r0, r1, c0, c1, state, mtile in tiles.parts(i0, min(i0 + bq, Lq), j0, j1):
                kj, vj = kb[:, c0 - j0 : c1 - j0], vb[:, c0 - j0 : c1 - j0]  # the part's keys, (g, bk, ·)
                e, dp = e_buf[:, : r1 - r0, : c1 - c0], dp_buf[:, : r1 - r0, : c1 - c0]
                np.matmul(r.q[:, r0:r1], kj.swapaxes(1, 2), out=e)  # (g, bq, d) @ (g, d, bk) -> (g, bq, bk) S
                mods = tiles.finish_scores(e, r0, c0, state, mtile)  # the mods' caches, for dS below
                np.subtract(e, r.m[:, r0:r1, None], out=e)
                np.exp(e, out=e)  # (g, bq, bk) E = exp(S - m); the forward's weights are E / ℓ
                np.matmul(r.da[:, r0:r1], vj.swapaxes(1, 2), out=dp)  # (g, bq, dv+1) @ (g, dv+1, bk) -> (dP - D) / ℓ
                do_l = r.da[:, r0:r1, :n_dv]  # (g, bq, dv) dO / ℓ, a view
                if not dropout:
                    dv[:, c0:c1] += e.swapaxes(1, 2) @ do_l  # (g, bk, bq) @ (g, bq, dv) -> (g, bk, dv)
                else:
                    keep = tiles.keep_tile(r0, r1, c0, c1)
                    dv[:, c0:c1] += (e * keep * scale_drop).swapaxes(1, 2) @ do_l  # the dropped weights
                    dp *= keep  # back through dropout: dP = dP_dropped ∘ keep / (1 - p)
                    dp *= scale_drop
                    np.subtract(dp, r.D_l[:, r0:r1, None], out=dp)
                np.multiply(dp, e, out=dp)  # (g, bq, bk) dS = E ∘ (dP - D) / ℓ = P ∘ (dP - D), the softmax VJP
                pivot, at = r.pivot[:, r0:r1], None  # (g, bq) the rows' j*, -1 for rows without a pivot
                if (pivot >= 0).any():
                    at = np.nonzero((pivot >= c0) & (pivot < c1))  # (heads, rows) whose j* is in this part
                    dp[at + (pivot[at] - c0,)] = 0.0  # dS_ij* is left out here: -Σ_{j≠j*} dS_ij at the end
                    row_sum[:, r0:r1] += dp.sum(axis=2)  # (g, bq) Σ_{j≠j*} dS_ij over this part's keys
                if mods:  # back through the score mods (a pivot's entry, 0 here, goes through them in _add_pivots)
                    dp, d_mods = F.score_mods_backward(dp, mods)  # (g, bq, bk) the scores' before the mods
                    add_score_params(d_params, d_mods)
                dq[:, r0:r1] += dp @ kj  # (g, bq, bk) @ (g, bk, d) -> (g, bq, d)
                dk[:, c0:c1] += dp.swapaxes(1, 2) @ r.q[:, r0:r1]  # (g, bk, bq) @ (g, bq, d) -> (g, bk, d)
                if d_bias is not None:
                    d_bias[:, r0:r1, c0:c1] += dp  # (g, bq, bk)


def _key_ranges(tiles: _Tiles, Lq: int, Lk: int, bq: int, bk: int, n: int) -> list[tuple[int, int]]:
    """Cut the key blocks (of bk keys; query blocks of bq) into at most n contiguous ranges [j_start, j_stop) with
    about as many non-empty tiles each (under a causal mask the early key blocks have the most)."""
    starts = range(0, Lk, bk)
    if n <= 1 or len(starts) <= 1:
        return [(0, Lk)]
    work = [
        sum(
            tiles.mask_state(i0, min(i0 + bq, Lq), j0, min(j0 + bk, Lk))[0] != _EMPTY
            for i0 in tiles.query_blocks(j0, min(j0 + bk, Lk), bq)
        )
        for j0 in starts
    ]  # non-empty tiles per key block (the states are remembered for the backward itself)
    total, ranges, done, first = max(1, sum(work)), [], 0, 0
    for idx, w in enumerate(work):
        done += w
        if (len(ranges) < n - 1 and done * n >= total * (len(ranges) + 1)) or idx == len(work) - 1:  # its share
            ranges.append((starts[first], min(starts[idx] + bk, Lk)))
            first = idx + 1
    return ranges


def _group_size(args: AttentionArgs, tile: tuple[int, int], threads: int) -> int:
    """How many heads one work item takes: 1 when tiles are bq × bk, more when a head's whole score
    matrix is smaller than a tile (short sequences), so that the tiny per-head products become one batched
    product over heads and the ~15 NumPy calls per tile are paid once per group, not once per head.

    Heads are grouped only when they share the mask (a tile is then skipped for all of them or for none),
    and never so much that the pool runs out of items."""
    B, H, Lq, Lk = args.shape
    if args.mask is not None and np.ndim(args.mask) >= 3 and np.shape(args.mask)[-3] > 1:
        return 1  # a mask per head: tiles are skipped head by head
    bq, bk = tile
    g = max(1, min(H, bq * bk // max(1, min(bq, Lq) * min(bk, Lk))))
    items_per_head_row = B * -(-Lq // bq)
    while g > 1 and items_per_head_row * -(-H // g) < 2 * threads:  # a few items per thread
        g = -(-g // 2)
    return g


# --------------------------------------------------------------------------- the kernel


@dataclass
class ChunkedCache:
    """What the chunked backward needs: q, k, v (as given: views, no copy), the context, each row's m and 1/ℓ.

    Nothing of size Lq × Lk is stored. ``attn_weights``, ``scores``, ``masked_scores`` and
    ``dropout_mask`` are (B, H, Lq, Lk) and computed only when read.
    """

    q: np.ndarray  # (B, H, Lq, d)
    k: np.ndarray  # (B, H, Lk, d)
    v: np.ndarray  # (B, H, Lk, dv)
    context: np.ndarray  # (B, H, Lq, dv), stored (B, Lq, H, dv): the head merge is then a view
    m: np.ndarray  # (B, H, Lq) row max of the masked scores
    inv_ell: np.ndarray  # (B, H, Lq) 1 / row sum of exp(S - m); 0 for a fully masked row
    jstar: np.ndarray  # (B, H, Lq) j*, the first key of the row's largest score; -1 for a fully masked row
    lse: np.ndarray  # (B, H, Lq) float64 m + log ℓ, the row's log-sum-exp; -inf for a fully masked row
    args: AttentionArgs
    seed: int | None
    kernel: ChunkedKernel
    tile_states: dict = field(default_factory=dict)  # (mask b, mask h, i0, i1, j0, j1) -> (state, mixed)

    def _tiles(self, b: int, hs: slice) -> _Tiles:
        return _Tiles(self.args, b, hs, self.seed, self.tile_states)

    @property
    def scores(self) -> np.ndarray:
        """(B, H, Lq, Lk) mods(q kᵀ · scale + bias) before the mask (computed now, Lq × Lk memory)."""
        s = (self.q * self.args.scale) @ self.k.swapaxes(-1, -2)  # (B, H, Lq, d) @ (B, H, d, Lk) -> (B, H, Lq, Lk)
        s = s if self.args.bias is None else s + self.args.bias
        index = self.args.index(*(np.arange(n) for n in self.args.shape))  # (b, h, i, j) of every score
        return F.score_mods_forward(s, self.args.score_mods, index)[0]

    @property
    def masked_scores(self) -> np.ndarray:
        """(B, H, Lq, Lk) scores after the mask (-inf where blocked); computed now."""
        s, mask = self.scores, self.args.mask
        if mask is None:
            return s
        if mask.dtype == np.bool_:
            return np.where(mask, s, -np.inf).astype(s.dtype, copy=False)
        return s + mask.astype(s.dtype, copy=False)

    @property
    def attn_weights(self) -> np.ndarray:
        """(B, H, Lq, Lk) softmax weights before dropout, exp(masked scores - m) / ℓ; computed now."""
        return np.exp(self.masked_scores - self.m[..., None]) * self.inv_ell[..., None]

    @property
    def dropout_mask(self) -> np.ndarray | None:
        """(B, H, Lq, Lk) bool keep-mask used by dropout, or None; assembled tile by tile now."""
        if self.args.keep is not None or self.seed is None:
            return self.args.keep
        B, H, Lq, Lk = self.args.shape
        bq, bk = self.kernel.tile(self.q.dtype, self.args.mask)
        out = np.empty((B, H, Lq, Lk), dtype=bool)
        for b in range(B):
            for h in range(H):
                tiles = self._tiles(b, slice(h, h + 1))
                for i0 in range(0, Lq, bq):
                    for j0 in range(0, Lk, bk):
                        i1, j1 = min(i0 + bq, Lq), min(j0 + bk, Lk)
                        out[b, h, i0:i1, j0:j1] = tiles.keep_tile(i0, i1, j0, j1)[0]
        return out


def _merged_layout(shape, dtype, zeros=False) -> np.ndarray:
    """A (B, H, L, d) array stored as (B, L, H, d): what ``merge_heads`` and ``split_heads_backward`` turn into
    (B, L, E) without a copy (a reshape of the transposed view). ``zeros``: start at 0 (np.zeros: the pages are
    zeroed as they are first written, not in a separate pass)."""
    B, H, L, d = shape
    out = np.zeros((B, L, H, d), dtype=dtype) if zeros else np.empty((B, L, H, d), dtype=dtype)
    return out.transpose(0, 2, 1, 3)  # (B, H, L, d) view


class ChunkedKernel(Kernel):
    """Blocked online softmax, memory O(L · block); ``block_size`` and ``num_threads`` None = measured defaults."""

    name = "chunked"
    score_arrays = 0  # tiles only: nothing of size Lq × Lk is kept

    def __init__(self, block_size: int | None = None, num_threads: int | None = None):
        self.block_size, self.num_threads = block_size, num_threads
        self._bias_lock = threading.Lock()

    # checked when set, not only in __init__: ``kernel.block_size = 0`` after construction silently meant the default
    @property
    def block_size(self) -> int | None:
        """Rows and columns of a tile (a positive int), or None for the measured default of the dtype."""
        return self._block_size

    @block_size.setter
    def block_size(self, value) -> None:
        self._block_size = positive_int_or_none(value, "block_size")

    @property
    def num_threads(self) -> int | None:
        """Threads of the pool (a positive int; 1 = the calling thread), or None for one per available core."""
        return self._num_threads

    @num_threads.setter
    def num_threads(self, value) -> None:
        self._num_threads = positive_int_or_none(value, "num_threads")

    def __repr__(self) -> str:
        return f"ChunkedKernel(block_size={self.block_size}, num_threads={self.num_threads})"

    def tile(self, dtype, mask=None) -> tuple[int, int]:
        """(bq, bk), the rows (queries) and columns (keys) of a tile for ``dtype``: ``block_size`` square if set, else
        a ``BlockMask``'s BLOCK_SIZE (Q_BLOCK, KV_BLOCK), two sides or one (its blocks are the tiles: each tile is
        one block, its state read, never evaluated), else the measured default square. Any other tile is correct
        too: a tile's state is taken over the blocks it touches."""
        if self.block_size:
            return self.block_size, self.block_size
        given = getattr(mask, "BLOCK_SIZE", None)
        if isinstance(given, tuple) and len(given) == 2:
            return int(given[0]), int(given[1])
        side = DEFAULT_BLOCK_SIZE.get(np.dtype(dtype).itemsize, 256)
        return side, side

    def block(self, dtype, mask=None) -> int:
        """The tile's rows, ``tile(dtype, mask)[0]`` (its side when it is square)."""
        return self.tile(dtype, mask)[0]

    def threads(self) -> int:
        """The pool's threads: ``num_threads``, or one per available core."""
        return self.num_threads or DEFAULT_NUM_THREADS

    def matmul(self, a, b):
        """The module's products on this kernel's pool (see ``mha_numpy.threads``: no BLAS thread left spinning)."""
        return pooled_matmul(a, b, self.threads())  # (N, K) @ (K, M) -> (N, M)

    def groups(self, args: AttentionArgs, dtype) -> list[tuple[int, slice]]:
        """The work items' (b, heads): one head each, or several when a head's scores are smaller than a tile."""
        B, H = args.shape[:2]
        g = _group_size(args, self.tile(dtype, args.mask), self.threads())
        return [(b, slice(h, min(h + g, H))) for b in range(B) for h in range(0, H, g)]

    def run(self, q, k, v, args: AttentionArgs):
        """The blocked forward: each item (b, heads, query block) walks its key blocks, online softmax."""
        B, H, Lq, Lk = args.shape
        (bq, bk), dt = self.tile(q.dtype, args.mask), q.dtype
        context = _merged_layout((B, H, Lq, v.shape[3]), dt)  # (B, H, Lq, dv)
        m, inv_ell = np.empty((B, H, Lq), dtype=dt), np.empty((B, H, Lq), dtype=dt)
        jstar, lse = np.empty((B, H, Lq), dtype=np.intp), np.empty((B, H, Lq), dtype=np.float64)
        cache = ChunkedCache(q, k, v, context, m, inv_ell, jstar, lse, args, args.seed(), self)  # q, k, v: views

        def work(item):
            b, hs, i0 = item
            rows = slice(i0, min(i0 + bq, Lq))
            _forward_rows(
                q[b, hs, rows], k[b, hs], v[b, hs], args.scale, cache._tiles(b, hs), i0, bk,
                context[b, hs, rows], m[b, hs, rows], inv_ell[b, hs, rows], jstar[b, hs, rows], lse[b, hs, rows],
            )  # fmt: skip

        # head by head (its K and V stay in cache: 2% faster at L = 2048 than interleaving heads), and in a head
        # the late query blocks first (under a causal mask they have the most tiles, so the last items are short)
        items = [(b, hs, i0) for b, hs in self.groups(args, dt) for i0 in reversed(range(0, Lq, bq))]
        run_items(work, items, self.threads())
        return context, cache

    def backward(self, d_context, cache: ChunkedCache, d_lse=None):
        """-> AttentionGrads: tiles recomputed per key range; pivots, sinks and score terms at the end."""
        q, k, v, o = cache.q, cache.k, cache.v, cache.context
        d_context = check_d_context(d_context, o.shape, o.dtype)  # (B, H, Lq, dv)
        d_lse = check_d_lse(d_lse, o.shape[:3], o.dtype)  # (B, H, Lq) or None
        B, H, Lq, Lk = cache.args.shape
        # (B, H, L, ·) each, stored so that split_heads_backward is a view
        dq, dk, dv = (_merged_layout(x.shape, q.dtype, zeros=True) for x in (q, k, v))
        bias = cache.args.bias
        d_bias = None if bias is None else np.zeros(np.shape(bias), dtype=q.dtype)  # the bias's own shape
        D = np.einsum("bhld,bhld->bhl", d_context, o)  # (B, H, Lq) rowsum(dO ∘ O)
        if d_lse is not None:
            D -= d_lse  # the lse's gradient joins the row term: dS = P ∘ (dP - (D - d_lse))
        pivot = np.where(cache.inv_ell >= 0.5, cache.jstar, -1)  # (B, H, Lq) j* where P_ij* = 1 / ℓ ≥ 1/2, else -1
        (bq, bk), threads = cache.kernel.tile(q.dtype, cache.args.mask), cache.kernel.threads()
        groups = cache.kernel.groups(cache.args, q.dtype)
        n_split = -(-threads // len(groups)) if 0 < len(groups) < threads else 1  # key ranges per group
        row_sums = np.zeros((n_split, B, H, Lq), dtype=q.dtype)  # per key range n: its Σ_{j≠j*} dS_ij

        def rows(b, hs) -> _HeadRows:
            m_l_D_j = (cache.m[b, hs], cache.inv_ell[b, hs], D[b, hs], pivot[b, hs])  # (g, Lq) each
            return _HeadRows.make(q[b, hs], k[b, hs], v[b, hs], cache.args.scale, d_context[b, hs], *m_l_D_j,
                                  cache._tiles(b, hs))  # fmt: skip

        # items: (b, heads, key range); a group split into key ranges shares its rows, and each range after the
        # first sums its share of dQ into a partial of its own, added to dq at the end (in order: deterministic)
        shared, items, partials = {}, [], {}
        for b, hs in groups:
            ranges = _key_ranges(cache._tiles(b, hs), Lq, Lk, bq, bk, n_split)
            if len(ranges) > 1:
                shared[b, hs.start] = rows(b, hs)
            items += [(b, hs, j_start, j_stop, n) for n, (j_start, j_stop) in enumerate(ranges)]

        def work(item):
            b, hs, j_start, j_stop, n = item
            g = len(range(H)[hs])
            r = shared.get((b, hs.start)) or rows(b, hs)
            target = (
                dq[b, hs] if n == 0 else partials.setdefault((b, hs.start, n), np.zeros((g, Lq, q.shape[3]), q.dtype))
            )
            db = None if bias is None else np.zeros((g, Lq, Lk), dtype=q.dtype)  # these heads' dS
            sums, params = row_sums[n, b, hs], item_params[b, hs.start, n]  # (g, Lq), this item's {mod: {param}}
            _backward_keys(r, bq, bk, j_start, j_stop, target, dk[b, hs], dv[b, hs], db, sums, params)
            if db is not None:
                with self._bias_lock:  # heads that share a bias entry add into it one at a time
                    for h, d_head in zip(range(H)[hs], db):
                        _add_reduced(d_bias, b, h, d_head)

        item_params = {(b, hs.start, n): {} for b, hs, _, _, n in items}  # each item's share of the mods' params
        run_items(work, items, threads)
        d_params: dict = {}
        for b, hs, _, _, n in items:  # summed in the items' order: deterministic
            add_score_params(d_params, item_params[b, hs.start, n])
        for b, hs, _, _, n in items:  # the partials in the items' order: deterministic
            if n > 0:
                dq[b, hs] += partials.pop((b, hs.start, n))  # (g, Lq, d)
        others = row_sums.sum(axis=0)  # (B, H, Lq) Σ_{j≠j*} dS_ij, the ranges in order
        total = 0.0 if d_lse is None else d_lse  # what a row's dS sums to, the sink's entry included
        sinks, d_sinks = cache.args.sinks, None
        if sinks is not None:  # the sink: an entry of value 0, dS_sink = P_sink (0 - D)
            ds_sink = -np.exp(sinks[:, None] - cache.m) * cache.inv_ell * D  # (B, H, Lq), P_sink = exp(σ - m) / ℓ
            d_sinks = ds_sink.sum(axis=(0, 2))  # (H,) each head's sink: the sum over its rows
            others += ds_sink  # a key's pivot is found from every other entry of its row, the sink's too
        _add_pivots(pivot, total - others, q, k, cache.args, dq, dk, d_bias, d_params)  # through the mods
        dq *= cache.args.scale  # the tiles saw q · scale  ->  dq = dq_scaled · scale
        return AttentionGrads(dq, dk, dv, d_bias, d_sinks, d_params, cache.args.score_mods)


def _add_reduced(d_bias: np.ndarray, b: int, h: int, d_head: np.ndarray) -> None:
    """Add one head's (Lq, Lk) dS into d_bias (the bias's shape, up to 4 axes) at (b, h), summing the
    axes the bias broadcasts over."""
    view = d_bias.reshape((1,) * (4 - d_bias.ndim) + d_bias.shape)  # (Bb, Hb, lq, lk), a view
    lq, lk = view.shape[2], view.shape[3]
    part = d_head.sum(axis=0, keepdims=True) if lq == 1 else d_head  # (lq, Lk)
    part = part.sum(axis=1, keepdims=True) if lk == 1 else part  # (lq, lk)
    view[b if view.shape[0] > 1 else 0, h if view.shape[1] > 1 else 0] += part


def _add_pivots(pivot, ds_pivot, q, k, args: AttentionArgs, dq, dk, d_bias, d_params) -> None:
    """The pivot entries dS_ij* (= -Σ_{j≠j*} dS_ij, or d_lse_i - Σ_{j≠j*} dS_ij when the lse is used) of the rows
    that have one, added where the tiles left them out: taken back through the score mods at those entries (their
    scores recomputed, one per row), then into dQ, dK, the bias and the mods' parameters.

    pivot: (B, H, Lq) j* or -1   ds_pivot: (B, H, Lq) dS_ij*, the gradient of the masked scores   q: (B, H, Lq, d)
    (unscaled)   k: (B, H, Lk, d)   dq: (B, H, Lq, d) the gradient w.r.t. the scaled q   dk: (B, H, Lk, d)
    d_bias: None or the bias's shape   d_params: {mod: {param: gradient}}, added to
    """
    b, h, i = np.nonzero(pivot >= 0)  # (n,) each: the rows with a pivot
    if b.size == 0:
        return  # no row has one (no key at all, or no row with P_ij* ≥ 1/2)
    j = pivot[b, h, i]  # (n,) their j*
    ds = ds_pivot[b, h, i]  # (n,) dS_ij*
    if args.score_mods:  # the entries' scores before the mods, as the tiles made them, then back through the mods
        s = np.einsum("nd,nd->n", q[b, h, i] * args.scale, k[b, h, j])  # (n,) q_i · k_j* · scale
        if args.bias is not None:
            s = s + np.broadcast_to(args.bias, args.shape)[b, h, i, j]  # (n,)
        index = (b, h, i, j if args.key_index is None else args.key_index[j])  # (n,) each: the entries' own
        _, mods = F.score_mods_forward(s, args.score_mods, index)
        ds, d_mods = F.score_mods_backward(ds, mods)  # (n,) dS_ij* before the mods
        add_score_params(d_params, d_mods)
    dq[b, h, i] += ds[:, None] * k[b, h, j]  # (n, d): dQ_i += dS_ij* K_j*, each row once
    np.add.at(dk, (b, h, j), ds[:, None] * (q[b, h, i] * args.scale))  # (n, d): dK_j* += dS_ij* Q_i; rows share j*
    if d_bias is not None:
        view = d_bias.reshape((1,) * (4 - d_bias.ndim) + d_bias.shape)  # (Bb, Hb, lq, lk), a view
        at = tuple(x if n > 1 else np.zeros_like(x) for x, n in zip((b, h, i, j), view.shape))  # (n,) each: a
        np.add.at(view, at, ds)  # broadcast axis indexed 0, so rows summed over the axes the bias broadcasts over
        # (as _add_reduced does) even when every axis broadcasts: then all n rows add into the one entry
