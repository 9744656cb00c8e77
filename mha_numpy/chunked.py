"""FlashAttention-style attention in NumPy: blocked, online softmax, memory O(L·block).

The vectorized path (``functional``) builds the whole score tensor (B, H, Lq, Lk): at L = 16384,
H = 4 in float32 that is 4 GiB for one tensor. Here a head's scores exist only one tile at a time.
Notation for one head: Q (Lq, d) already multiplied by ``scale``, K (Lk, d), V (Lk, dv); query
block i has rows Qᵢ (bq, d), key block j has rows Kⱼ, Vⱼ (bk, ·); Sᵢⱼ = Qᵢ Kⱼᵀ is a (bq, bk) tile.

Forward (``_forward_rows``), for each query block, walk the key blocks keeping per row a running
max m, a running sum ℓ and an unnormalised context A (online softmax):

    m' = max(m, rowmax Sᵢⱼ)      α = exp(m - m')      Pᵢⱼ = exp(Sᵢⱼ - m')
    ℓ' = α ℓ + rowsum Pᵢⱼ         A' = α A + Pᵢⱼ Vⱼ
    at the end:  Oᵢ = A / ℓ,   lseᵢ = m + log ℓ   (log-sum-exp of the row: all the backward needs)

Backward (``_backward_head``) never stores P: it recomputes each tile Pᵢⱼ = exp(Sᵢⱼ - lseᵢ) and,
with the row term D = rowsum(dO ∘ O) (= Σⱼ Pᵢⱼ dPᵢⱼ, the softmax VJP's subtracted sum), gives

    dVⱼ += Pᵢⱼᵀ dOᵢ     dPᵢⱼ = dOᵢ Vⱼᵀ     dSᵢⱼ = Pᵢⱼ ∘ (dPᵢⱼ - Dᵢ)     dQᵢ += dSᵢⱼ Kⱼ     dKⱼ += dSᵢⱼᵀ Qᵢ

Masks (bool True = may attend, or float added) are cut into the same tiles: a tile with no
allowed position is skipped entirely (so a causal mask skips the blocks above the diagonal), a
tile with every position allowed is not touched. A row with no allowed key gets lse = +inf, which
makes its recomputed weights exactly 0: zero weights, zero context, zero (finite) gradients.

Dropout (training): the keep-mask of a tile is either cut from a given ``dropout_mask`` or drawn
from its own generator seeded by (seed, b, h, i, j), so the backward regenerates exactly the same
tile without anything of size Lq × Lk being stored. ``cache.dropout_mask`` assembles it on request.

Parallelism: work items are (b, h, query block) in the forward and (b, h) in the backward (a
head's dQ receives a contribution from every key block, so a head stays on one thread). With
``num_threads`` > 1 they run on a thread pool (NumPy releases the GIL inside BLAS and ufuncs) and
BLAS is limited to one thread meanwhile (threadpoolctl), so the two levels do not oversubscribe.
With ``num_threads`` = 1 the items run in the calling thread and BLAS uses its own threads.
``attn_weights`` / ``scores`` of the cache are computed only when asked for (they are Lq × Lk).
"""

from __future__ import annotations

import contextlib
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from . import functional as F
from ._checks import as_float_array, check_dropout, check_mask
from .attention import MHACache

# Both picked by measurement on the 2-core machine of docs/performance.md (block-size sweep there):
# big tiles amortise the ~15 NumPy calls (and their moments holding the GIL) per tile; the best was
# 512 × 512 in float32 and 256 × 256 in float64 (1 MiB and 512 KiB a tile). A pool of one thread per
# available core beats BLAS's own threading on these small (block × d) products.
DEFAULT_BLOCK_SIZE = {4: 512, 8: 256}  # by itemsize; other dtypes use 256
DEFAULT_NUM_THREADS = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)

_EMPTY, _FULL, _PARTIAL = 0, 1, 2  # a mask tile: nothing allowed / everything allowed / mixed


# --------------------------------------------------------------------------- arguments


def check_block_size(block_size, dtype=np.float64) -> int:
    """None -> DEFAULT_BLOCK_SIZE for dtype; otherwise a positive int, or ValueError naming block_size."""
    if block_size is None:
        return DEFAULT_BLOCK_SIZE.get(np.dtype(dtype).itemsize, 256)
    if isinstance(block_size, bool) or not isinstance(block_size, (int, np.integer)) or block_size <= 0:
        raise ValueError(f"block_size must be a positive int or None, got {block_size!r}")
    return int(block_size)


def check_num_threads(num_threads) -> int:
    """None -> DEFAULT_NUM_THREADS; otherwise a positive int, or ValueError naming num_threads."""
    if num_threads is None:
        return DEFAULT_NUM_THREADS
    if isinstance(num_threads, bool) or not isinstance(num_threads, (int, np.integer)) or num_threads <= 0:
        raise ValueError(f"num_threads must be a positive int or None, got {num_threads!r}")
    return int(num_threads)


# --------------------------------------------------------------------------- threads

_POOLS: dict[int, ThreadPoolExecutor] = {}


_CONTROLLER: list = []  # the threadpoolctl controller, made once (finding the BLAS libraries takes ~0.5 ms)


@contextlib.contextmanager
def _blas_single_threaded():
    """Limit BLAS to one thread while our own pool runs (no-op without threadpoolctl)."""
    if not _CONTROLLER:
        try:
            from threadpoolctl import ThreadpoolController
        except ImportError:  # pragma: no cover - threadpoolctl is in requirements.txt
            _CONTROLLER.append(None)
        else:
            _CONTROLLER.append(ThreadpoolController())
    if _CONTROLLER[0] is None:  # pragma: no cover
        yield
        return
    with _CONTROLLER[0].limit(limits=1, user_api="blas"):
        yield


def _run(work, items, num_threads: int) -> None:
    """Call ``work(item)`` for every item: in this thread, or on a pool of ``num_threads``."""
    if num_threads == 1 or len(items) == 1:
        for item in items:
            work(item)
        return
    pool = _POOLS.get(num_threads)
    if pool is None:
        pool = _POOLS[num_threads] = ThreadPoolExecutor(num_threads, thread_name_prefix="mha_numpy")
    n_groups = min(len(items), 4 * num_threads)  # a few groups per thread: balance, little hand-off cost

    def work_group(g: int) -> None:
        for item in items[g::n_groups]:  # interleaved, so a causal mask's light and heavy blocks mix
            work(item)

    with _blas_single_threaded():
        for _ in pool.map(work_group, range(n_groups)):  # re-raises the first exception of a worker
            pass


# --------------------------------------------------------------------------- tiles


class _Tiles:
    """The mask and dropout of one head, cut into (query block × key block) tiles."""

    def __init__(self, mask, keep, seed, p, b, h):
        self.mask, self.keep, self.seed, self.p, self.b, self.h = mask, keep, seed, p, b, h

    def mask_tile(self, i0: int, i1: int, j0: int, j1: int):
        """-> (_EMPTY | _FULL | _PARTIAL, tile or None). The tile is a broadcast view."""
        if self.mask is None:
            return _FULL, None
        m = self.mask[i0:i1, j0:j1]
        if m.dtype == np.bool_:
            if not m.any():
                return _EMPTY, None
            return (_FULL, None) if m.all() else (_PARTIAL, m)
        if np.isneginf(m).all():
            return _EMPTY, None
        return (_PARTIAL, m) if m.any() else (_FULL, None)

    def keep_tile(self, i0: int, i1: int, j0: int, j1: int):
        """Dropout keep-mask of the tile (bool, (i1 - i0, j1 - j0)), or None without dropout."""
        if self.keep is not None:
            return self.keep[i0:i1, j0:j1]
        if self.p == 0.0:
            return None
        tile_rng = np.random.default_rng((self.seed, self.b, self.h, i0, j0))
        return tile_rng.random((i1 - i0, j1 - j0)) >= self.p


def _masked_scores(s: np.ndarray, state: int, tile) -> None:
    """Apply a _PARTIAL mask tile to the score tile s in place (bool: block -> -inf; float: add)."""
    if state != _PARTIAL:
        return
    if tile.dtype == np.bool_:
        np.copyto(s, -np.inf, where=~tile)
    else:
        np.add(s, tile, out=s, casting="unsafe")


# --------------------------------------------------------------------------- one query block, forward


def _forward_rows(q, k, v, tiles: _Tiles, i0: int, bk: int, out, lse) -> None:
    """Online softmax of one query block against all key blocks.

    q: (n, d) scaled queries, rows i0 ... i0 + n - 1   k: (Lk, d)   v: (Lk, dv)
    writes out: (n, dv) the context rows and lse: (n,) their log-sum-exp (+inf: nothing allowed).
    """
    n, Lk, dt = q.shape[0], k.shape[0], q.dtype
    m = np.full(n, -np.inf, dtype=dt)  # running row max
    ell = np.zeros(n, dtype=dt)  # running row sum of exp(s - m)
    acc = np.zeros((n, v.shape[1]), dtype=dt)  # running unnormalised context, Σ exp(s - m) v
    buf = np.empty((n, min(bk, Lk)), dtype=dt)  # the score tile, reused
    scale_drop = 1.0 / (1.0 - tiles.p) if tiles.p > 0 else 1.0
    for j0 in range(0, Lk, bk):
        j1 = min(j0 + bk, Lk)
        state, mtile = tiles.mask_tile(i0, i0 + n, j0, j1)
        if state == _EMPTY:
            continue  # e.g. above the causal diagonal: no work at all
        s = buf[:, : j1 - j0]
        np.matmul(q, k[j0:j1].T, out=s)  # (n, d) @ (d, bk) -> (n, bk) scores, scale already in q
        _masked_scores(s, state, mtile)
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
    empty = ell == 0.0  # rows where the mask allowed nothing
    np.divide(acc, np.where(empty, 1.0, ell)[:, None], out=out)  # (n, dv); empty rows stay 0
    lse[...] = np.where(empty, np.inf, m + np.log(np.where(empty, 1.0, ell)))


# --------------------------------------------------------------------------- one head, backward


def _backward_head(q, k, v, d_out, lse, D, tiles: _Tiles, bq: int, bk: int, dq, dk, dv) -> None:
    """Backward of one head, tile by tile, recomputing P from lse (FlashAttention-2 order).

    q: (Lq, d) scaled   k: (Lk, d)   v: (Lk, dv)   d_out: (Lq, dv)   lse, D: (Lq,)
    writes dq: (Lq, d) (gradient w.r.t. the scaled q), dk: (Lk, d), dv: (Lk, dv); all start at 0.
    The two row subtractions ride along in the GEMMs as one extra column (two passes saved per tile):
    S - lse = [q, -lse] [k, 1]ᵀ   and   dP - D = [dO, -D] [v, 1]ᵀ.
    """
    Lq, Lk, d, dt = q.shape[0], k.shape[0], q.shape[1], q.dtype
    dropout = tiles.p > 0 or tiles.keep is not None
    ones = np.ones((Lk, 1), dtype=dt)
    neg_lse = np.where(np.isinf(lse), 0.0, -lse)  # a fully masked row (lse = +inf) is all -inf by its mask
    qa = np.concatenate([q, neg_lse[:, None]], axis=1)  # (Lq, d + 1)
    ka = np.concatenate([k, ones], axis=1)  # (Lk, d + 1)
    da = np.concatenate([d_out, -D[:, None]], axis=1)  # (Lq, dv + 1)
    va = np.concatenate([v, ones], axis=1)  # (Lk, dv + 1)
    if dropout:  # dropout scales dP before D is subtracted: no extra column on that side
        da, va = d_out, v
    p_buf = np.empty((min(bq, Lq), min(bk, Lk)), dtype=dt)
    dp_buf = np.empty_like(p_buf)
    scale_drop = 1.0 / (1.0 - tiles.p) if tiles.p > 0 else 1.0
    for j0 in range(0, Lk, bk):
        j1 = min(j0 + bk, Lk)
        kj, dkj, dvj = ka[j0:j1, :d], dk[j0:j1], dv[j0:j1]
        for i0 in range(0, Lq, bq):
            i1 = min(i0 + bq, Lq)
            state, mtile = tiles.mask_tile(i0, i1, j0, j1)
            if state == _EMPTY:
                continue  # all weights 0 here: no gradient flows through this tile
            qi, doi = qa[i0:i1, :d], d_out[i0:i1]
            p = p_buf[: i1 - i0, : j1 - j0]
            dp = dp_buf[: i1 - i0, : j1 - j0]
            np.matmul(qa[i0:i1], ka[j0:j1].T, out=p)  # (bq, d+1) @ (d+1, bk) -> (bq, bk) S - lse
            _masked_scores(p, state, mtile)
            np.exp(p, out=p)  # (bq, bk) P, exactly the forward's normalised weights
            np.matmul(da[i0:i1], va[j0:j1].T, out=dp)  # (bq, dv+1) @ (dv+1, bk) -> (bq, bk) dP - D
            if not dropout:
                dvj += p.T @ doi  # (bk, bq) @ (bq, dv) -> (bk, dv)
            else:
                keep = tiles.keep_tile(i0, i1, j0, j1)
                dvj += (p * keep * scale_drop).T @ doi  # dV uses the dropped weights
                dp *= keep  # back through dropout: dP = dP_dropped ∘ keep / (1 - p)
                dp *= scale_drop
                np.subtract(dp, D[i0:i1, None], out=dp)
            np.multiply(dp, p, out=dp)  # (bq, bk) dS = P ∘ (dP - D), the softmax VJP
            dq[i0:i1] += dp @ kj  # (bq, bk) @ (bk, d) -> (bq, d)
            dkj += dp.T @ qi  # (bk, bq) @ (bq, d) -> (bk, d)


# --------------------------------------------------------------------------- attention on (B, H, L, d)


class ChunkedAttentionCache:
    """What the chunked backward needs: the scaled q, k, v, the context, lse, the mask and dropout.

    Nothing of size Lq × Lk is stored. ``attn_weights``, ``scores``, ``masked_scores`` and
    ``dropout_mask`` are (B, H, Lq, Lk) and computed only when read (from q, k, the mask and lse).
    """

    impl = "chunked"

    def __init__(self, q_scaled, k, v, context, lse, mask, scale, block_size, num_threads, p, seed, keep):
        self.q_scaled, self.k, self.v, self.context, self.lse = q_scaled, k, v, context, lse
        self.mask, self.scale, self.block_size, self.num_threads = mask, scale, block_size, num_threads
        self.p, self.seed, self.keep = p, seed, keep

    def _tiles(self, b: int, h: int) -> _Tiles:
        B, H, Lq, _ = self.q_scaled.shape
        mask = None if self.mask is None else np.broadcast_to(self.mask, (B, H, Lq, self.k.shape[2]))[b, h]
        keep = None if self.keep is None else self.keep[b, h]
        return _Tiles(mask, keep, self.seed, self.p, b, h)

    @property
    def scores(self) -> np.ndarray:
        """(B, H, Lq, Lk) q kᵀ · scale before the mask (computed now, Lq × Lk memory)."""
        return self.q_scaled @ self.k.swapaxes(-1, -2)  # (B, H, Lq, d) @ (B, H, d, Lk)

    @property
    def masked_scores(self) -> np.ndarray:
        """(B, H, Lq, Lk) scores after the mask (-inf where blocked); computed now."""
        s = self.scores
        if self.mask is None:
            return s
        if self.mask.dtype == np.bool_:
            return np.where(self.mask, s, -np.inf).astype(s.dtype, copy=False)
        return s + self.mask.astype(s.dtype, copy=False)

    @property
    def attn_weights(self) -> np.ndarray:
        """(B, H, Lq, Lk) softmax weights before dropout, exp(masked scores - lse); computed now."""
        return np.exp(self.masked_scores - self.lse[..., None])  # fully masked rows: lse = +inf -> 0

    @property
    def dropout_mask(self) -> np.ndarray | None:
        """(B, H, Lq, Lk) bool keep-mask used by dropout, or None; assembled tile by tile now."""
        if self.keep is not None or self.p == 0.0:
            return self.keep
        B, H, Lq, _ = self.q_scaled.shape
        Lk, bs = self.k.shape[2], self.block_size
        out = np.empty((B, H, Lq, Lk), dtype=bool)
        for b in range(B):
            for h in range(H):
                tiles = self._tiles(b, h)
                for i0 in range(0, Lq, bs):
                    for j0 in range(0, Lk, bs):
                        i1, j1 = min(i0 + bs, Lq), min(j0 + bs, Lk)
                        out[b, h, i0:i1, j0:j1] = tiles.keep_tile(i0, i1, j0, j1)
        return out


def _heads_contiguous(x: np.ndarray) -> np.ndarray:
    """(B, H, L, d) -> the same values with each head's (L, d) rows contiguous (a copy if needed)."""
    return x if x[0, 0].flags.c_contiguous else np.ascontiguousarray(x)


def attention_forward_scaled(
    q_scaled, k, v, mask, scale: float, block_size: int, num_threads: int, p: float, seed, keep, context=None
):
    """Chunked softmax(q_scaled kᵀ + mask) v on arrays already checked.

    q_scaled: (B, H, Lq, d) = q · scale   k: (B, H, Lk, d)   v: (B, H, Lk, dv)
    context: optional (B, H, Lq, dv) array (any strides) to write into.
    -> context (B, H, Lq, dv), ChunkedAttentionCache
    """
    B, H, Lq, _ = q_scaled.shape
    if context is None:
        context = np.empty((B, H, Lq, v.shape[3]), dtype=q_scaled.dtype)
    lse = np.empty((B, H, Lq), dtype=q_scaled.dtype)
    cache = ChunkedAttentionCache(q_scaled, k, v, context, lse, mask, scale, block_size, num_threads, p, seed, keep)
    bs = block_size

    def work(item):
        b, h, i0 = item
        i1 = min(i0 + bs, Lq)
        _forward_rows(
            q_scaled[b, h, i0:i1], k[b, h], v[b, h], cache._tiles(b, h), i0, bs, context[b, h, i0:i1], lse[b, h, i0:i1]
        )

    items = [(b, h, i0) for b in range(B) for h in range(H) for i0 in range(0, Lq, bs)]
    _run(work, items, num_threads)
    return context, cache


def attention_backward_scaled(d_context, cache: ChunkedAttentionCache, dq=None, dk=None, dv=None):
    """d_context (B, H, Lq, dv) -> dq_scaled (B, H, Lq, d) (w.r.t. q · scale), dk, dv.

    dq, dk, dv: optional zero-filled output arrays (any strides) to accumulate into.
    """
    q, k, v, o = cache.q_scaled, cache.k, cache.v, cache.context
    B, H, Lq, _ = q.shape
    dq = np.zeros(q.shape, dtype=q.dtype) if dq is None else dq
    dk = np.zeros(k.shape, dtype=q.dtype) if dk is None else dk
    dv = np.zeros(v.shape, dtype=q.dtype) if dv is None else dv
    D = np.einsum("bhld,bhld->bhl", d_context, o)  # (B, H, Lq) rowsum(dO ∘ O)
    bs = cache.block_size

    def work(item):
        b, h = item
        _backward_head(
            q[b, h], k[b, h], v[b, h], d_context[b, h], cache.lse[b, h], D[b, h], cache._tiles(b, h), bs, bs,
            dq[b, h], dk[b, h], dv[b, h],
        )  # fmt: skip

    _run(work, [(b, h) for b in range(B) for h in range(H)], cache.num_threads)
    return dq, dk, dv


def _dropout_setup(shape, dropout_p: float, rng, dropout_mask):
    """-> (p, seed, keep) for the tiles; validates like functional.dropout_forward."""
    keep = check_dropout(shape, dropout_p, rng, dropout_mask)
    if keep is not None:
        return dropout_p, None, keep
    if dropout_p == 0.0:
        return 0.0, None, None
    return dropout_p, int(rng.integers(2**63)), None


def attention_forward(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    mask: np.ndarray | None = None,
    scale: float | None = None,
    dropout_p: float = 0.0,
    rng: np.random.Generator | None = None,
    dropout_mask: np.ndarray | None = None,
    block_size: int | None = None,
    num_threads: int | None = None,
):
    """Chunked softmax(q kᵀ · scale + mask) v, same contract as
    ``functional.scaled_dot_product_attention_forward``.

    q: (B, H, Lq, d)   k: (B, H, Lk, d)   v: (B, H, Lk, dv)   mask broadcastable to (B, H, Lq, Lk)
    -> context (B, H, Lq, dv), ChunkedAttentionCache (``attn_weights`` computed on request)
    """
    q, k, v = F._check_qkv(q, k, v)  # the same checks as the vectorized path
    B, H, Lq, d = q.shape
    mask = check_mask(mask, (B, H, Lq, k.shape[2]))
    dt = np.result_type(q, k, v)
    block_size, num_threads = check_block_size(block_size, dt), check_num_threads(num_threads)
    p, seed, keep = _dropout_setup((B, H, Lq, k.shape[2]), dropout_p, rng, dropout_mask)
    scale = 1.0 / float(np.sqrt(d)) if scale is None else float(scale)  # a Python float keeps float32
    q_scaled = np.multiply(q, scale, dtype=dt, out=np.empty(q.shape, dtype=dt))  # (B, H, Lq, d) contiguous
    k = _heads_contiguous(k.astype(dt, copy=False))  # (B, H, Lk, d)
    v = _heads_contiguous(v.astype(dt, copy=False))  # (B, H, Lk, dv)
    return attention_forward_scaled(q_scaled, k, v, mask, scale, block_size, num_threads, p, seed, keep)


def attention_backward(d_context: np.ndarray, cache: ChunkedAttentionCache):
    """d_context (B, H, Lq, dv) -> dq (B, H, Lq, d), dk (B, H, Lk, d), dv (B, H, Lk, dv)."""
    d_context = as_float_array(d_context, "d_context", ndim=4).astype(cache.q_scaled.dtype, copy=False)
    if d_context.shape != cache.context.shape:
        raise ValueError(f"d_context has shape {d_context.shape}, expected {cache.context.shape} like the context")
    dq_scaled, dk, dv = attention_backward_scaled(d_context, cache)
    dq_scaled *= cache.scale  # q_scaled = q · scale  ->  dq = dq_scaled · scale
    return dq_scaled, dk, dv


# --------------------------------------------------------------------------- the module


class ChunkedMHACache(MHACache):
    """``MHACache`` of impl="chunked". Q is computed when read (the kernels keep Q · scale);
    ``attn_weights`` and ``scores`` are computed when read (see ChunkedAttentionCache)."""

    def __init__(self, attention: ChunkedAttentionCache, K, V, context, caches):
        self.attention, self.K, self.V, self.context, self._caches = attention, K, V, context, caches
        self.impl = "chunked"

    @property
    def Q(self) -> np.ndarray:  # noqa: N802 - the name of the MHACache field
        """(B, H, Lq, d) the projected queries (q_scaled / scale, computed now)."""
        return self.attention.q_scaled / self.attention.scale

    def __repr__(self) -> str:
        return f"ChunkedMHACache(context={self.context.shape}, block_size={self.attention.block_size})"


def _project(x, W, b):
    """x (B, L, in) @ Wᵀ + b -> (B, L, out) as one GEMM over the B·L rows."""
    y = x.reshape(-1, x.shape[-1]) @ W.T  # (B·L, in) @ (in, out) -> (B·L, out)
    if b is not None:
        y += b
    return y.reshape(x.shape[0], x.shape[1], W.shape[0])


def _heads(x, H: int):
    """(B, L, E) -> (B, H, L, d) view (no copy): head h is columns h·d ... (h+1)·d - 1."""
    B, L, E = x.shape
    return x.reshape(B, L, H, E // H).transpose(0, 2, 1, 3)


def mha_forward(mha, query, key, value, mask, dropout_p: float, dropout_mask):
    """``MultiHeadAttention.forward`` with impl="chunked" (inputs already checked by the module).

    Self-attention (query is key is value): one GEMM with the stacked (3E, E) weight gives q, k, v.
    The scale is folded into W_q and b_q, so the kernels see Q · scale and never rescale a tile.
    """
    P, H, E = mha.params, mha.num_heads, mha.embed_dim
    B, Lq, Lk = query.shape[0], query.shape[1], key.shape[1]
    scale = 1.0 / float(np.sqrt(mha.head_dim))  # a Python float keeps float32
    block_size, num_threads = check_block_size(mha.block_size, mha.dtype), check_num_threads(mha.num_threads)
    p, seed, keep = _dropout_setup((B, H, Lq, Lk), dropout_p, mha.rng, dropout_mask)
    b_q, b_k, b_v = (P.get(n) for n in ("b_q", "b_k", "b_v"))
    fused = query is key and key is value
    if fused:
        W = np.concatenate([P["W_q"] * scale, P["W_k"], P["W_v"]])  # (3E, E)
        bias = None if b_q is None else np.concatenate([b_q * scale, b_k, b_v])  # (3E,)
        qkv = _project(query, W, bias)  # (B, L, 3E): one GEMM for the three projections
        q, k, v = qkv[..., :E], qkv[..., E : 2 * E], qkv[..., 2 * E :]  # (B, L, E) views
    else:
        q = _project(query, P["W_q"] * scale, None if b_q is None else b_q * scale)  # (B, Lq, E)
        k = _project(key, P["W_k"], b_k)  # (B, Lk, E)
        v = _project(value, P["W_v"], b_v)  # (B, Lk, E)
    merged = np.empty((B, Lq, E), dtype=mha.dtype)  # the heads' contexts land here, already merged
    _, att = attention_forward_scaled(
        _heads(q, H), _heads(k, H), _heads(v, H), mask, scale, block_size, num_threads, p, seed, keep,
        context=_heads(merged, H),
    )  # fmt: skip
    output = _project(merged, P["W_o"], P.get("b_o"))  # (B, Lq, E)
    caches = dict(query=query, key=key, value=value, merged=merged, fused=fused)
    return output, ChunkedMHACache(att, att.k, att.v, att.context, caches)


def mha_backward(mha, d_output, cache: ChunkedMHACache) -> dict[str, np.ndarray]:
    """``MultiHeadAttention.backward`` for impl="chunked": dQ, dK, dV land in one (B, L, 3E) buffer
    when the forward was fused, so the three weight gradients are one GEMM too."""
    P, H, E = mha.params, mha.num_heads, mha.embed_dim
    c = cache._caches
    query, key, value, merged = c["query"], c["key"], c["value"], c["merged"]
    d_out2 = d_output.reshape(-1, E)  # (B·Lq, E)
    g: dict[str, np.ndarray] = {}
    g["W_o"] = d_out2.T @ merged.reshape(-1, E)  # (E, B·Lq) @ (B·Lq, E) -> (E, E)
    d_merged = (d_out2 @ P["W_o"]).reshape(merged.shape)  # (B, Lq, E)
    B, Lq, Lk = query.shape[0], query.shape[1], key.shape[1]
    if c["fused"]:
        dqkv = np.zeros((B, Lq, 3 * E), dtype=mha.dtype)  # (B, L, 3E), same layout as the forward's qkv
        dq, dk, dv = dqkv[..., :E], dqkv[..., E : 2 * E], dqkv[..., 2 * E :]
    else:
        dq, dk, dv = np.zeros((B, Lq, E), mha.dtype), np.zeros((B, Lk, E), mha.dtype), np.zeros((B, Lk, E), mha.dtype)
    attention_backward_scaled(_heads(d_merged, H), cache.attention, _heads(dq, H), _heads(dk, H), _heads(dv, H))
    dq *= cache.attention.scale  # q_scaled = scale · (query W_qᵀ + b_q)
    g["query"] = dq @ P["W_q"]  # (B, Lq, E) @ (E, E) -> (B, Lq, E)
    g["key"] = dk @ P["W_k"]  # (B, Lk, E) @ (E, kdim) -> (B, Lk, kdim)
    g["value"] = dv @ P["W_v"]  # (B, Lk, E) @ (E, vdim) -> (B, Lk, vdim)
    if c["fused"]:
        dqkv2 = dqkv.reshape(-1, 3 * E)  # (B·L, 3E)
        dW = dqkv2.T @ query.reshape(-1, E)  # (3E, B·L) @ (B·L, E) -> (3E, E): one GEMM
        g["W_q"], g["W_k"], g["W_v"] = dW[:E], dW[E : 2 * E], dW[2 * E :]
        if mha.bias:
            g["b_q"], g["b_k"], g["b_v"] = np.split(dqkv2.sum(axis=0), 3)
    else:
        for name, x, dx in (("q", query, dq), ("k", key, dk), ("v", value, dv)):
            dx2 = dx.reshape(-1, E)  # (B·L, E)
            g["W_" + name] = dx2.T @ x.reshape(-1, x.shape[-1])  # (E, B·L) @ (B·L, in) -> (E, in)
            if mha.bias:
                g["b_" + name] = dx2.sum(axis=0)
    if mha.bias:
        g["b_o"] = d_out2.sum(axis=0)
    return g
