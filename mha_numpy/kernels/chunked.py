"""FlashAttention-style attention in NumPy: blocked, online softmax, memory O(L·block).

The vectorized path (``functional``) builds the whole score tensor (B, H, Lq, Lk): at L = 16384,
H = 4 in float32 that is 4 GiB for one tensor. Here a head's scores exist only one tile at a time.
Notation for one head: Q (Lq, d) already multiplied by ``scale``, K (Lk, d), V (Lk, dv); query
block i has rows Qᵢ (bq, d), key block j has rows Kⱼ, Vⱼ (bk, ·); Sᵢⱼ = Qᵢ Kⱼᵀ is a (bq, bk) tile.

Forward (``_forward_rows``), for each query block, walk the key blocks keeping per row a running
max m, a running sum ℓ and an unnormalised context A (online softmax):

    m' = max(m, rowmax Sᵢⱼ)      α = exp(m - m')      Pᵢⱼ = exp(Sᵢⱼ - m')
    ℓ' = α ℓ + rowsum Pᵢⱼ         A' = α A + Pᵢⱼ Vⱼ
    at the end:  Oᵢ = A / ℓ, and the row's m and ℓ are kept (all the backward needs)

m and ℓ are kept apart, not folded into lse = m + log ℓ as FlashAttention does: in the working
dtype, log ℓ is absorbed when |m| is large (a row blocked by a finite mask such as finfo.min, or
float32 logits of 1e4), and exp(S - lse) then gives weights that do not sum to 1. exp(S - m) / ℓ
is as exact as the plain softmax.

Backward (``_backward_head``) never stores P: it recomputes each tile Pᵢⱼ = exp(Sᵢⱼ - mᵢ) / ℓᵢ and,
with the row term D = rowsum(dO ∘ O) (= Σⱼ Pᵢⱼ dPᵢⱼ, the softmax VJP's subtracted sum), gives

    dVⱼ += Pᵢⱼᵀ dOᵢ     dPᵢⱼ = dOᵢ Vⱼᵀ     dSᵢⱼ = Pᵢⱼ ∘ (dPᵢⱼ - Dᵢ)     dQᵢ += dSᵢⱼ Kⱼ     dKⱼ += dSᵢⱼᵀ Qᵢ

Masks (bool True = may attend, or float added) are cut into the same tiles: a tile with no
allowed position is skipped entirely (so a causal mask skips the blocks above the diagonal), a
tile with every position allowed is not touched. A row with no allowed key gets ℓ = 0 and 1/ℓ is
stored as 0, which makes its recomputed weights exactly 0: zero weights, zero context, zero
(finite) gradients. A float ``bias`` (ALiBi, a relative-position table) is added like a float mask,
and its gradient, the sum of dS over the bias's broadcast axes, is accumulated tile by tile.

Dropout (training): the keep-mask of a tile is either cut from a given ``dropout_mask`` or drawn
from its own generator seeded by (seed, b, h, i, j), so the backward regenerates exactly the same
tile without anything of size Lq × Lk being stored. ``cache.dropout_mask`` assembles it on request.

Parallelism: work items are (b, h, query block) in the forward and (b, h) in the backward (a
head's dQ receives a contribution from every key block, so a head stays on one thread). With
``num_threads`` > 1 they run on a thread pool (NumPy releases the GIL inside BLAS and ufuncs) and
BLAS is limited to one thread meanwhile (``_threads``), so the two levels do not oversubscribe.
With ``num_threads`` = 1 the items run in the calling thread and BLAS uses its own threads.
``attn_weights`` / ``scores`` of the cache are computed only when asked for (they are Lq × Lk).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import numpy as np

from .._checks import check_d_context
from ._threads import AVAILABLE_CORES, run_items
from .base import AttentionArgs, Kernel

# Both picked by measurement on the 2-core machine of docs/performance.md (block-size sweep there):
# big tiles amortise the ~15 NumPy calls (and their moments holding the GIL) per tile; the best was
# 512 × 512 in float32 and 256 × 256 in float64 (1 MiB and 512 KiB a tile). A pool of one thread per
# available core beats BLAS's own threading on these small (block × d) products.
DEFAULT_BLOCK_SIZE = {4: 512, 8: 256}  # by itemsize
DEFAULT_NUM_THREADS = AVAILABLE_CORES

_EMPTY, _FULL, _PARTIAL = 0, 1, 2  # a mask tile: nothing allowed / everything allowed / mixed


def _positive_int_or_none(value, name: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise ValueError(f"{name} must be a positive int or None, got {value!r}")
    return int(value)


# --------------------------------------------------------------------------- tiles


class _Tiles:
    """The mask, bias and dropout of one head (b, h), cut into (query block × key block) tiles."""

    def __init__(self, args: AttentionArgs, b: int, h: int, seed, states: dict):
        self.mask = None if args.mask is None else np.broadcast_to(args.mask, args.shape)[b, h]  # (Lq, Lk) view
        self.bias = None if args.bias is None else np.broadcast_to(args.bias, args.shape)[b, h]  # (Lq, Lk) view
        self.keep = None if args.keep is None else args.keep[b, h]  # (Lq, Lk)
        self.p, self.seed, self.b, self.h = args.dropout_p, seed, b, h
        mshape = (1,) * (4 - np.ndim(args.mask)) + np.shape(args.mask)  # the mask's own (b, h, Lq, Lk) sizes
        self.states = states  # heads and batch items that share their mask share its tile states:
        self.key = (b if mshape[0] > 1 else 0, h if mshape[1] > 1 else 0)  # the key of this head's mask

    def mask_state(self, i0: int, i1: int, j0: int, j1: int):
        """-> (_EMPTY | _FULL | _PARTIAL, the mask tile or None), looked up before any work on the tile.

        Found once per tile of each distinct mask and remembered (forward and backward, every head sharing it).
        """
        if self.mask is None:
            return _FULL, None
        key = (*self.key, i0, j0)
        state = self.states.get(key)
        if state is None:
            m = self.mask[i0:i1, j0:j1]
            blocked = ~m if m.dtype == np.bool_ else np.isneginf(m)
            state = _EMPTY if blocked.all() else (_FULL if m.dtype == np.bool_ and not blocked.any() else _PARTIAL)
            self.states[key] = state  # one dict item set: safe from several threads
        return state, (self.mask[i0:i1, j0:j1] if state == _PARTIAL else None)

    def finish_scores(self, s: np.ndarray, i0: int, j0: int, state: int, m) -> None:
        """Add the bias and apply a _PARTIAL mask tile m to the score tile s = S[i0:, j0:] in place."""
        if self.bias is not None:
            np.add(s, self.bias[i0 : i0 + s.shape[0], j0 : j0 + s.shape[1]], out=s, casting="unsafe")  # as vectorized
        if state == _PARTIAL:
            if m.dtype == np.bool_:
                np.copyto(s, -np.inf, where=~m)
            else:
                np.add(s, m, out=s, casting="unsafe")

    def keep_tile(self, i0: int, i1: int, j0: int, j1: int):
        """Dropout keep-mask of the tile (bool, (i1 - i0, j1 - j0)), or None without dropout."""
        if self.keep is not None:
            return self.keep[i0:i1, j0:j1]
        if self.seed is None:
            return None
        tile_rng = np.random.default_rng((self.seed, self.b, self.h, i0, j0))
        return tile_rng.random((i1 - i0, j1 - j0)) >= self.p


# --------------------------------------------------------------------------- one query block, forward


def _forward_rows(q, k, v, scale: float, tiles: _Tiles, i0: int, bk: int, out, m_out, inv_ell_out) -> None:
    """Online softmax of one query block against all key blocks.

    q: (n, d) queries, rows i0 ... i0 + n - 1   k: (Lk, d)   v: (Lk, dv)   (any row strides)
    writes out: (n, dv) the context rows, m_out: (n,) the row max and inv_ell_out: (n,) 1 / row sum
    (0 for a row where nothing is allowed).
    """
    n, Lk, dt = q.shape[0], k.shape[0], q.dtype
    q = q * scale  # (n, d) the block's scaled queries: no tile is rescaled
    m = np.full(n, -np.inf, dtype=dt)  # running row max
    ell = np.zeros(n, dtype=dt)  # running row sum of exp(s - m)
    acc = np.zeros((n, v.shape[1]), dtype=dt)  # running unnormalised context, Σ exp(s - m) v
    buf = np.empty((n, min(bk, Lk)), dtype=dt)  # the score tile, reused
    scale_drop = 1.0 / (1.0 - tiles.p) if tiles.p > 0 else 1.0
    for j0 in range(0, Lk, bk):
        j1 = min(j0 + bk, Lk)
        state, mtile = tiles.mask_state(i0, i0 + n, j0, j1)
        if state == _EMPTY:
            continue  # nothing allowed here: not even the product is computed
        s = buf[:, : j1 - j0]
        np.matmul(q, k[j0:j1].T, out=s)  # (n, d) @ (d, bk) -> (n, bk) scores, scale already in q
        tiles.finish_scores(s, i0, j0, state, mtile)
        m_new = np.maximum(m, s.max(axis=1))  # (n,)
        m_new[np.isneginf(m_new)] = 0.0  # row with nothing allowed yet: shift by 0, exp(-inf) = 0
        alpha = np.exp(m - m_new)  # (n,) rescales what was summed with the old max
        np.subtract(s, m_new[:, None], out=s)
        np.exp(s, out=s)  # (n, bk) P tile, not yet normalised
        ell *= alpha
        ell += s.sum(axis=1)
        acc *= alpha[:, None]
        keep = tiles.keep_tile(i0, i0 + n, j0, j1)
        if keep is not None:
            s *= keep  # dropout acts on the weights after the softmax, not on ℓ
            s *= scale_drop
        acc += s @ v[j0:j1]  # (n, bk) @ (bk, dv) -> (n, dv)
        m = m_new
    inv_ell = np.divide(1.0, ell, out=np.zeros_like(ell), where=ell != 0)  # (n,); rows with nothing allowed: 0
    np.multiply(acc, inv_ell[:, None], out=out)  # (n, dv); rows with nothing allowed stay 0
    m_out[...] = np.where(np.isneginf(m), 0.0, m)
    inv_ell_out[...] = np.where(np.isnan(ell), np.nan, inv_ell)  # a NaN row stays NaN


# --------------------------------------------------------------------------- one head, backward


def _backward_head(q, k, v, scale, d_out, m, inv_ell, D, tiles: _Tiles, bq, bk, dq, dk, dv, d_bias) -> None:
    """Backward of one head, tile by tile, recomputing P = exp(S - m) / ℓ (FlashAttention-2 order).

    q: (Lq, d) queries (scaled here, once per head)   k: (Lk, d)   v: (Lk, dv)   d_out: (Lq, dv)   m, inv_ell, D: (Lq,)
    writes dq: (Lq, d) (gradient w.r.t. the scaled q), dk: (Lk, d), dv: (Lk, dv); all start at 0;
    d_bias: None or the (Lq, Lk) gradient of this head's bias tile by tile (start at 0).
    The 1/ℓ of each row rides along in the rows of dO and q (dV = Eᵀ (dO/ℓ), dK = dS'ᵀ (q/ℓ)) and is
    applied to dQ once at the end, with E = exp(S - m) and dS' = E ∘ (dP - D) = ℓ dS. dP - D is one GEMM
    with an extra column: [dO, -D] [v, 1]ᵀ.
    """
    Lq, Lk, dt = q.shape[0], k.shape[0], q.dtype
    dropout = tiles.keep is not None or tiles.seed is not None
    scale_drop = 1.0 / (1.0 - tiles.p) if tiles.p > 0 else 1.0
    q = q * scale  # (Lq, d) this head's scaled queries, as the forward's tiles saw them
    do_l = d_out * inv_ell[:, None]  # (Lq, dv) dO / ℓ
    q_l = q * inv_ell[:, None]  # (Lq, d) q / ℓ
    da = np.concatenate([d_out, -D[:, None]], axis=1)  # (Lq, dv + 1)
    va = np.concatenate([v, np.ones((Lk, 1), dtype=dt)], axis=1)  # (Lk, dv + 1)
    if dropout:  # dropout scales dP before D is subtracted: no extra column on that side
        da, va = d_out, v
    e_buf = np.empty((min(bq, Lq), min(bk, Lk)), dtype=dt)
    dp_buf = np.empty_like(e_buf)
    for j0 in range(0, Lk, bk):
        j1 = min(j0 + bk, Lk)
        for i0 in range(0, Lq, bq):
            i1 = min(i0 + bq, Lq)
            state, mtile = tiles.mask_state(i0, i1, j0, j1)
            if state == _EMPTY:
                continue  # all weights 0 here: no gradient flows through this tile
            e = e_buf[: i1 - i0, : j1 - j0]
            dp = dp_buf[: i1 - i0, : j1 - j0]
            np.matmul(q[i0:i1], k[j0:j1].T, out=e)  # (bq, d) @ (d, bk) -> (bq, bk) S
            tiles.finish_scores(e, i0, j0, state, mtile)
            np.subtract(e, m[i0:i1, None], out=e)
            np.exp(e, out=e)  # (bq, bk) E = exp(S - m); the forward's weights are E / ℓ
            np.matmul(da[i0:i1], va[j0:j1].T, out=dp)  # (bq, dv+1) @ (dv+1, bk) -> (bq, bk) dP - D
            if not dropout:
                dv[j0:j1] += e.T @ do_l[i0:i1]  # (bk, bq) @ (bq, dv) -> (bk, dv)
            else:
                keep = tiles.keep_tile(i0, i1, j0, j1)
                dv[j0:j1] += (e * keep * scale_drop).T @ do_l[i0:i1]  # dV uses the dropped weights
                dp *= keep  # back through dropout: dP = dP_dropped ∘ keep / (1 - p)
                dp *= scale_drop
                np.subtract(dp, D[i0:i1, None], out=dp)
            np.multiply(dp, e, out=dp)  # (bq, bk) dS' = E ∘ (dP - D) = ℓ · dS, the softmax VJP
            dq[i0:i1] += dp @ k[j0:j1]  # (bq, bk) @ (bk, d) -> (bq, d), divided by ℓ below
            dk[j0:j1] += dp.T @ q_l[i0:i1]  # (bk, bq) @ (bq, d) -> (bk, d)
            if d_bias is not None:
                d_bias[i0:i1, j0:j1] += dp * inv_ell[i0:i1, None]  # dS = dS' / ℓ
    dq *= inv_ell[:, None]


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
    args: AttentionArgs
    seed: int | None
    kernel: ChunkedKernel
    tile_states: dict = field(default_factory=dict)  # (mask b, mask h, i0, j0) -> _EMPTY | _FULL | _PARTIAL

    def _tiles(self, b: int, h: int) -> _Tiles:
        return _Tiles(self.args, b, h, self.seed, self.tile_states)

    @property
    def scores(self) -> np.ndarray:
        """(B, H, Lq, Lk) q kᵀ · scale (+ bias) before the mask (computed now, Lq × Lk memory)."""
        s = (self.q * self.args.scale) @ self.k.swapaxes(-1, -2)  # (B, H, Lq, d) @ (B, H, d, Lk) -> (B, H, Lq, Lk)
        return s if self.args.bias is None else s + self.args.bias

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
        bs = self.kernel.block(self.q.dtype)
        out = np.empty((B, H, Lq, Lk), dtype=bool)
        for b in range(B):
            for h in range(H):
                tiles = self._tiles(b, h)
                for i0 in range(0, Lq, bs):
                    for j0 in range(0, Lk, bs):
                        i1, j1 = min(i0 + bs, Lq), min(j0 + bs, Lk)
                        out[b, h, i0:i1, j0:j1] = tiles.keep_tile(i0, i1, j0, j1)
        return out


def _merged_layout(shape, dtype, fill=None) -> np.ndarray:
    """A (B, H, L, d) array stored as (B, L, H, d): what ``merge_heads`` and ``split_heads_backward`` turn into
    (B, L, E) without a copy (a reshape of the transposed view)."""
    B, H, L, d = shape
    out = np.empty((B, L, H, d), dtype=dtype) if fill is None else np.full((B, L, H, d), fill, dtype=dtype)
    return out.transpose(0, 2, 1, 3)  # (B, H, L, d) view


class ChunkedKernel(Kernel):
    """Blocked online softmax, memory O(L · block); ``block_size`` and ``num_threads`` None = measured defaults."""

    name = "chunked"

    def __init__(self, block_size: int | None = None, num_threads: int | None = None):
        self.block_size = _positive_int_or_none(block_size, "block_size")
        self.num_threads = _positive_int_or_none(num_threads, "num_threads")
        self._bias_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"ChunkedKernel(block_size={self.block_size}, num_threads={self.num_threads})"

    def block(self, dtype) -> int:
        return self.block_size or DEFAULT_BLOCK_SIZE.get(np.dtype(dtype).itemsize, 256)

    def threads(self) -> int:
        return self.num_threads or DEFAULT_NUM_THREADS

    def run(self, q, k, v, args: AttentionArgs):
        B, H, Lq, Lk = args.shape
        bs, dt = self.block(q.dtype), q.dtype
        context = _merged_layout((B, H, Lq, v.shape[3]), dt)  # (B, H, Lq, dv)
        m, inv_ell = np.empty((B, H, Lq), dtype=dt), np.empty((B, H, Lq), dtype=dt)
        cache = ChunkedCache(q, k, v, context, m, inv_ell, args, args.seed(), self)  # q, k, v kept as views

        def work(item):
            b, h, i0 = item
            rows = slice(i0, min(i0 + bs, Lq))
            _forward_rows(
                q[b, h, rows], k[b, h], v[b, h], args.scale, cache._tiles(b, h), i0, bs,
                context[b, h, rows], m[b, h, rows], inv_ell[b, h, rows],
            )  # fmt: skip

        run_items(work, [(b, h, i0) for b in range(B) for h in range(H) for i0 in range(0, Lq, bs)], self.threads())
        return context, cache

    def backward(self, d_context, cache: ChunkedCache):
        q, k, v, o = cache.q, cache.k, cache.v, cache.context
        d_context = check_d_context(d_context, o.shape, o.dtype)  # (B, H, Lq, dv)
        B, H, Lq, Lk = cache.args.shape
        dq, dk, dv = (_merged_layout(x.shape, q.dtype, fill=0) for x in (q, k, v))  # (B, H, L, ·), split_heads views
        bias = cache.args.bias
        d_bias = None if bias is None else np.zeros(np.shape(bias), dtype=q.dtype)  # the bias's own shape
        D = np.einsum("bhld,bhld->bhl", d_context, o)  # (B, H, Lq) rowsum(dO ∘ O)
        bs = cache.kernel.block(q.dtype)

        def work(item):
            b, h = item
            db = None if bias is None else np.zeros((Lq, Lk), dtype=q.dtype)  # this head's dS
            rows = (cache.m[b, h], cache.inv_ell[b, h], D[b, h])  # (Lq,) each
            _backward_head(
                q[b, h], k[b, h], v[b, h], cache.args.scale, d_context[b, h], *rows,
                cache._tiles(b, h), bs, bs, dq[b, h], dk[b, h], dv[b, h], db,
            )  # fmt: skip
            if db is not None:
                with self._bias_lock:  # heads that share a bias entry add into it one at a time
                    _add_reduced(d_bias, b, h, db)

        run_items(work, [(b, h) for b in range(B) for h in range(H)], cache.kernel.threads())
        dq *= cache.args.scale  # the tiles saw q · scale  ->  dq = dq_scaled · scale
        return dq, dk, dv, d_bias


def _add_reduced(d_bias: np.ndarray, b: int, h: int, d_head: np.ndarray) -> None:
    """Add one head's (Lq, Lk) dS into d_bias (the bias's shape, up to 4 axes) at (b, h), summing the
    axes the bias broadcasts over."""
    view = d_bias.reshape((1,) * (4 - d_bias.ndim) + d_bias.shape)  # (Bb, Hb, lq, lk), a view
    lq, lk = view.shape[2], view.shape[3]
    part = d_head.sum(axis=0, keepdims=True) if lq == 1 else d_head  # (lq, Lk)
    part = part.sum(axis=1, keepdims=True) if lk == 1 else part  # (lq, lk)
    view[b if view.shape[0] > 1 else 0, h if view.shape[1] > 1 else 0] += part
