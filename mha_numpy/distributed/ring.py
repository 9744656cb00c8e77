"""Ring attention (context parallelism) over MPI: forward and backward, one rank's side of it.

Each of P ranks holds L/P positions of one sequence (``shards.Sharding``: contiguous or zigzag): its queries q
(B, H, L/P, d) and its keys and values k, v (B, Hkv, L/P, d) (Hkv < H: grouped-query attention). The keys and
values travel around the ring: at step s rank r holds the block of rank (r - s) mod P, attends its queries to it
(one kernel call per piece, ``blocks.pieces``: causal and padding masks, fully masked pieces skipped) and, while
it computes, already sends the block on to r + 1 and receives the next one from r - 1 (``comm.Ring.shift``). The
partial results over the P disjoint key blocks merge exactly through their log-sum-exps
(``functional.merge_attention_forward``): the rank ends with its rows of softmax(Q Kᵀ · scale + mask) V over all
L keys, never having held more than one block of keys.

    forward, P = 4, rank r holds q_r and, at step s, the block of rank r - s:

        step 0      step 1      step 2      step 3
        r0: kv0     r0: kv3     r0: kv2     r0: kv1        kv blocks move  r0 -> r1 -> r2 -> r3 -> r0
        r1: kv1     r1: kv0     r1: kv3     r1: kv2
        r2: kv2     r2: kv1     r2: kv0     r2: kv3
        r3: kv3     r3: kv2     r3: kv1     r3: kv0

The backward (as ring-flash-attention's, and the Ring Attention paper's) sends the blocks around once more, each
with the gradient of its keys and values: at step s the rank recomputes its pieces with the block it holds (the
kernel's forward, whose cache the kernel's backward reads), adds its contribution to the block's dK, dV, and
passes block and gradient on together. After P steps every gradient has visited every rank and comes home. The
merge's backward gives each piece its upstream gradients (d_context, d_lse) first; the kernel's backward with
``d_lse`` does the rest. dQ stays home.

Per rank: one block of K, V in flight and one being used (2 · L/P · Hkv · d each), the kernel's scores of one
piece at a time, and the partial contexts of its rows, which the merge keeps for its backward (per batch item and
head: P partials of L/P rows, L · dv, contiguous; 2P of L/2P rows for each of its two chunks, 2L · dv, zigzag).
Sent per rank: (P - 1) blocks of K, V in the forward; (P - 1) of K, V and P of dK, dV in the backward.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import functional as F
from .._checks import as_float_array
from ..kernels import get_kernel
from .blocks import pieces
from .comm import Ring
from .shards import Sharding

KV_TAG, GRAD_TAG = 10, 20  # message tags: K and V (10, 11), dK and dV (20, 21)


@dataclass
class RingCache:
    """A rank's ring backward needs: q (B, H, L/P, d), k, v (B, Hkv, L/P, ·), each chunk's merge cache, the settings."""

    q: np.ndarray  # (B, H, L/P, d) this rank's queries
    k: np.ndarray  # (B, Hkv, L/P, d) this rank's keys and values
    v: np.ndarray  # (B, Hkv, L/P, dv)
    merges: list  # per local query chunk: the merge's cache, or None when no key reached the chunk
    sharding: Sharding
    length: int
    causal: bool
    key_valid: np.ndarray | None
    scale: float | None
    kernel: object
    n_rep: int


def check_ring_inputs(q, k, v, ring: Ring, sharding: Sharding, key_valid):
    """q (B, H, n, d), k (B, Hkv, n, d), v (B, Hkv, n, dv) with H a multiple of Hkv, n · P = L; key_valid None or
    (B, L) bool -> (q, k, v, L, H // Hkv), or ValueError naming the argument."""
    q, k, v = (as_float_array(x, name, ndim=4) for x, name in ((q, "q"), (k, "k"), (v, "v")))
    if sharding.size != ring.size:
        raise ValueError(f"sharding is for {sharding.size} ranks, the ring has {ring.size}")
    B, H, n, d = q.shape
    if k.shape[:3] != (B, k.shape[1], n) or v.shape[:3] != k.shape[:3] or k.shape[-1] != d:
        raise ValueError(f"k {k.shape} and v {v.shape} must be (B, Hkv, n, d) and (B, Hkv, n, dv) for q {q.shape}")
    if H % k.shape[1]:
        raise ValueError(f"q has {H} heads, k and v {k.shape[1]}: H must be a multiple of Hkv (grouped-query)")
    if not q.dtype == k.dtype == v.dtype:
        raise ValueError(f"q, k, v must share one dtype: got {q.dtype}, {k.dtype}, {v.dtype}")
    length = n * ring.size
    sharding.check_length(length)
    if key_valid is not None:
        key_valid = np.asarray(key_valid)
        if key_valid.dtype != np.bool_ or key_valid.shape != (B, length):
            raise ValueError(f"key_valid must be bool (B, L) = ({B}, {length}) (True = a real key), got "
                             f"{key_valid.dtype} {key_valid.shape}")  # fmt: skip
    return q, k, v, length, H // k.shape[1], key_valid


def ring_attention_forward(
    q, k, v, ring: Ring, sharding: Sharding, causal=False, key_valid=None, scale=None, kernel="vectorized",
    order="sequential",
):  # fmt: skip
    """This rank's q (B, H, L/P, d), k (B, Hkv, L/P, d), v (B, Hkv, L/P, dv) -> ((context (B, H, L/P, dv),
    lse (B, H, L/P) float64), cache): its rows of attention over the whole sequence.

    Every rank calls it (collectively) with its own shard, of the same shape on every rank (a rank that raises
    leaves the others waiting: MPI's rule). causal: the causal mask over global positions.
    key_valid: None or (B, L) bool over the whole sequence, True = a real key (the same on every rank).
    order: the merge order of the partials ("sequential": as they arrive, "tree", "flat";
    ``functional.merge_attention_forward``)."""
    q, k, v, length, n_rep, key_valid = check_ring_inputs(q, k, v, ring, sharding, key_valid)
    if order not in F.MERGE_ORDERS:
        raise ValueError(f"order must be one of {F.MERGE_ORDERS}, got {order!r}")
    kernel = get_kernel(kernel)
    chunks = sharding.local_slices(ring.rank, length)
    contexts, lses = [[] for _ in chunks], [[] for _ in chunks]
    block_k, block_v = k, v
    for step in range(ring.size):
        owner = (ring.rank - step) % ring.size
        last = step == ring.size - 1
        pending = None if last else ring.shift(block_k, block_v, tag=KV_TAG)  # F1: the next block is on its way
        k_rep, _ = F.repeat_kv_forward(block_k, n_rep, check=False)  # F2: (B, Hkv, n, d) -> (B, H, n, d)
        v_rep, _ = F.repeat_kv_forward(block_v, n_rep, check=False)  # F2: (B, Hkv, n, dv) -> (B, H, n, dv)
        for p in pieces(sharding, ring.rank, owner, length, causal, key_valid):
            ctx, c = kernel.forward(q[:, :, p.rows], k_rep[:, :, p.cols], v_rep[:, :, p.cols], mask=p.mask,
                                    scale=scale)  # F3: (B, H, lq, dv), c.lse (B, H, lq)  # fmt: skip
            contexts[p.a].append(ctx)
            lses[p.a].append(c.lse)
        if pending is not None:
            block_k, block_v = pending.wait()
    B, H, n, _ = q.shape
    context = np.zeros((B, H, n, v.shape[-1]), dtype=q.dtype)  # a chunk no key reached: zero context, lse -inf
    lse = np.full((B, H, n), -np.inf)
    merges = []
    for rows, cs, ls in zip(chunks, contexts, lses):
        if not cs:
            merges.append(None)
            continue
        (context[:, :, rows], lse[:, :, rows]), m = F.merge_attention_forward(cs, ls, order=order)  # F4
        merges.append(m)
    cache = RingCache(q, k, v, merges, sharding, length, causal, key_valid, scale, kernel, n_rep)
    return (context, lse), cache


def ring_attention_backward(d_context, cache: RingCache, ring: Ring, d_lse=None):
    """d_context (B, H, L/P, dv) (and d_lse (B, H, L/P) or None) -> dq (B, H, L/P, d), dk (B, Hkv, L/P, d),
    dv (B, Hkv, L/P, dv): the gradients of this rank's shards. Every rank calls it (collectively)."""
    c = cache
    q, k, v = c.q, c.k, c.v
    B, H, n, dv_dim = q.shape[0], q.shape[1], q.shape[2], v.shape[-1]
    d_context = as_float_array(d_context, "d_context", ndim=4)
    if d_context.shape != (B, H, n, dv_dim):
        raise ValueError(f"d_context has shape {d_context.shape}, expected the context's {(B, H, n, dv_dim)}")
    if d_lse is not None and np.shape(d_lse) != (B, H, n):
        raise ValueError(f"d_lse has shape {np.shape(d_lse)}, expected the lse's {(B, H, n)}")
    chunks = c.sharding.local_slices(ring.rank, c.length)
    upstream = []  # per query chunk: an iterator over its pieces' (d_context, d_lse), in the forward's order
    for rows, m in zip(chunks, c.merges):
        if m is None:
            upstream.append(iter(()))
            continue
        d_lse_rows = None if d_lse is None else d_lse[:, :, rows]
        d_ctxs, d_lses = F.merge_attention_backward(d_context[:, :, rows], m, d_lse_rows)  # ← F4
        upstream.append(zip(d_ctxs, d_lses))
    dq = np.zeros_like(q)
    block_k, block_v = k, v
    grad_k, grad_v = np.zeros_like(k), np.zeros_like(v)  # the gradient of the block this rank holds
    pending_grad = None
    for step in range(ring.size):
        owner = (ring.rank - step) % ring.size
        last = step == ring.size - 1
        pending_kv = None if last else ring.shift(block_k, block_v, tag=KV_TAG)  # ← F1: the block moves on
        k_rep, rep_k = F.repeat_kv_forward(block_k, c.n_rep, check=False)  # F2 again: (B, H, n, d)
        v_rep, rep_v = F.repeat_kv_forward(block_v, c.n_rep, check=False)  # (B, H, n, dv)
        dk_rep, dv_rep = np.zeros_like(k_rep), np.zeros_like(v_rep)  # (B, H, n, d), (B, H, n, dv)
        for p in pieces(c.sharding, ring.rank, owner, c.length, c.causal, c.key_valid):
            _, pc = c.kernel.forward(q[:, :, p.rows], k_rep[:, :, p.cols], v_rep[:, :, p.cols], mask=p.mask,
                                     scale=c.scale)  # F3 recomputed: the kernel's cache for its backward  # fmt: skip
            d_ctx, d_lse_piece = next(upstream[p.a])
            dq_p, dk_p, dv_p, _, _ = c.kernel.backward(d_ctx, pc, d_lse=d_lse_piece)  # ← F3
            dq[:, :, p.rows] += dq_p  # (B, H, lq, d)
            dk_rep[:, :, p.cols] += dk_p  # (B, H, lk, d)
            dv_rep[:, :, p.cols] += dv_p  # (B, H, lk, dv)
        dk_block = F.repeat_kv_backward(dk_rep, rep_k)  # ← F2: (B, Hkv, n, d), summed over each group
        dv_block = F.repeat_kv_backward(dv_rep, rep_v)  # ← F2: (B, Hkv, n, dv)
        if pending_grad is not None:  # the block's gradient so far, from the ranks it visited before
            grad_k, grad_v = pending_grad.wait()
        grad_k, grad_v = grad_k + dk_block, grad_v + dv_block
        if pending_kv is not None:
            block_k, block_v = pending_kv.wait()
        pending_grad = ring.shift(grad_k, grad_v, tag=GRAD_TAG)  # ← F1: the gradient follows its block
    dk, dv = pending_grad.wait()  # after P steps each block's gradient is home
    return dq, dk, dv
