"""Issue 35: the chunked kernel on structured masks whose edge tiles are empty, and flash-attention's window grid.

- A ``StructuredMask`` whose band leaves key blocks that no query sees (a causal mask with a negative diagonal, a
  window with a negative offset, Lk > Lq + window) made ``query_range`` return a start past the last query, and
  the backward visited a query block starting at Lq: IndexError, at the default block size and through
  ``impl="auto"``. The symmetric case (query blocks that see no key) and fully masked rows: zero weights, zero
  context, zero gradients. Against the vectorized kernel and torch SDPA, float64.
- flash-attention's tests (tests/test_flash_attn.py) draw a window (left, right) per case, -1 meaning unbounded,
  with causal = (left, 0), over seqlen pairs with Lq != Lk both ways, and compare with a reference that builds the
  mask from its definition (``construct_local_mask``: query i sits at i + Lk - Lq, bottom-right). Ours, written
  from the same definition: both alignments, windows with negative offsets (right < 0: the window ends before the
  diagonal; left < 0: it starts after it), tiny blocks so that most tiles are empty, forward and backward of the
  chunked kernel against the vectorized one.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import rel_err, require_torch

from mha_numpy import MultiHeadAttention, kernels, masks
from mha_numpy.kernels.chunked import ChunkedCache
from mha_numpy.masks import StructuredMask

TOL = 1e-12  # float64: the chunked and the vectorized paths round differently, by a few ulps


def qkv_grad(rng, B, H, Lq, Lk, d=8):
    q, k, v = (rng.standard_normal((B, H, n, d)) for n in (Lq, Lk, Lk))
    return q, k, v, rng.standard_normal((B, H, Lq, d))


def run(kernel, q, k, v, d_out, mask):
    """-> (context, cache, (dq, dk, dv)) of one kernel."""
    out, cache = kernel.forward(q, k, v, mask=mask)
    return out, cache, kernel.backward(d_out, cache)[:3]


def assert_same(chunked, vectorized, label):
    """Context and dq, dk, dv equal to TOL relative to the largest entry (a zero in theory judged so too)."""
    for name, a, b in zip(("context", "dq", "dk", "dv"), (chunked[0], *chunked[2]), (vectorized[0], *vectorized[2])):
        assert np.isfinite(a).all() and rel_err(a, b) < TOL, f"{label}: {name} {rel_err(a, b):.2e}"


def assert_unseen_are_zero(dense, out, cache, grads, label):
    """Rows with no allowed key: zero weights, context, dq; keys no query may see: zero dk, dv. Exactly 0."""
    dq, dk, dv = grads
    rows, cols = ~dense.any(-1), ~dense.any(-2)  # (Lq,), (Lk,)
    assert not out[..., rows, :].any() and not dq[..., rows, :].any(), label
    assert not cache.attn_weights[..., rows, :].any(), label
    assert not dk[..., cols, :].any() and not dv[..., cols, :].any(), label


# --------------------------------------------------------------------------- the crash of issue 35

L = 1024
EDGE_CASES = {  # (Lq, Lk, mask): each leaves whole key blocks (or query blocks) of the default 256 unseen
    "causal, diagonal -300": (L, L, masks.causal_mask(L, diagonal=-300, structured=True)),
    "window 64, offset -300": (L, L, masks.sliding_window_mask(L, L, 64, offset=-300, structured=True)),
    "Lk > Lq + window, offset -7": (256, L, masks.sliding_window_mask(256, L, 100, offset=-7, structured=True)),
    "symmetric window, Lk > Lq + window": (256, L, masks.sliding_window_mask(256, L, 100, False, structured=True)),
    "queries past the keys": (L, 256, masks.sliding_window_mask(L, 256, 100, False, structured=True)),
    "bottom-right causal, Lq > Lk": (L, 300, masks.causal_mask(L, 300, align="bottom-right", structured=True)),
    "window past the last key": (300, 300, masks.sliding_window_mask(300, 300, 8, False, 400, structured=True)),
}


@pytest.mark.parametrize("case", list(EDGE_CASES))
def test_chunked_backward_at_the_default_block_with_blocks_no_query_or_key_sees(case):
    """The IndexError of issue 35 (four of these cases crashed): forward and backward at the default block size
    (256 in float64), equal to the vectorized kernel; the unseen rows and keys exactly 0."""
    Lq, Lk, m = EDGE_CASES[case]
    dense = np.asarray(m)[0, 0]
    assert (~dense.any(0)).any() or (~dense.any(1)).any()  # the premise: something is unseen
    q, k, v, d_out = qkv_grad(np.random.default_rng(0), 1, 2, Lq, Lk)
    chunked = run(kernels.ChunkedKernel(), q, k, v, d_out, m)
    assert_same(chunked, run(kernels.VectorizedKernel(), q, k, v, d_out, m), case)
    assert_unseen_are_zero(dense, *chunked, case)


def test_the_issue_cases_against_torch_sdpa():
    """The same cases against torch SDPA in float64 (it gives fully masked rows 0, as we do)."""
    torch = require_torch()
    for case, (Lq, Lk, m) in EDGE_CASES.items():
        q, k, v, d_out = qkv_grad(np.random.default_rng(1), 1, 2, Lq, Lk)
        out, _, grads = run(kernels.ChunkedKernel(), q, k, v, d_out, m)
        tq, tk, tv = (torch.from_numpy(a).requires_grad_() for a in (q, k, v))
        ref = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, attn_mask=torch.from_numpy(np.asarray(m)))
        ref.backward(torch.from_numpy(d_out))
        for name, ours, theirs in zip(("context", "dq", "dk", "dv"), (out, *grads), (ref, tq.grad, tk.grad, tv.grad)):
            assert rel_err(ours, theirs.detach().numpy()) < 1e-12, f"{case}: {name}"


def test_the_module_with_impl_auto_runs_the_chunked_backward_on_a_negative_diagonal():
    """Issue 35 as reported: MultiHeadAttention(impl="auto") at L = 1024 chooses the chunked kernel; its backward
    crashed. Every gradient equal to the same module on the vectorized kernel."""
    rng = np.random.default_rng(2)
    x, d_out = rng.standard_normal((1, L, 16)), rng.standard_normal((1, L, 16))
    m = masks.causal_mask(L, diagonal=-300, structured=True)
    grads = {}
    for impl in ("auto", "vectorized"):
        mha = MultiHeadAttention(16, 2, rng=0, impl=impl)
        out, cache = mha.forward(x, x, x, mask=m)
        assert isinstance(cache.attention, ChunkedCache) == (impl == "auto")
        grads[impl] = out, mha.backward(d_out, cache)
    (out, g), (out_v, g_v) = grads["auto"], grads["vectorized"]
    assert rel_err(out, out_v) < TOL
    largest = max(np.abs(a).max() for a in g_v.values())  # b_k's gradient is 0 in theory: judged against this
    for key in g_v:
        assert np.abs(g[key] - g_v[key]).max() < TOL * largest, key
    # rows 0 ... 299 see no key: a zero context (the output is the output bias alone) and no query gradient
    np.testing.assert_array_equal(out[0, :300], np.broadcast_to(mha.params["b_o"], (300, 16)))
    assert not g["query"][0, :300].any()


def test_the_ranges_stay_inside_the_sequence():
    """The contract the kernel relies on: 0 <= lo <= hi <= L from key_range and query_range, lo = hi when empty
    (``query_range`` gave (1068, 1068) for the last key block of a 1024-query mask)."""
    m = masks.causal_mask(L, diagonal=-300, structured=True)
    assert m.query_range(0, 768, 1024) == (L, L) and m.key_range(0, 0, 256) == (0, 0)
    far = masks.sliding_window_mask(300, 300, 8, False, 400, structured=True)  # every query past every key
    assert far.key_range(0, 256, 300) == (300, 300) and far.query_range(0, 0, 300)[0] <= 300
    # and the kernel visits no block of an empty range (an empty range at 1000 used to give the block at 768)
    m = masks.causal_mask(1000, diagonal=-300, structured=True)
    x = np.zeros((1, 1, 1000, 2))
    tiles = kernels.ChunkedKernel(block_size=256).forward(x, x, x, mask=m)[1]._tiles(0, slice(0, 1))
    assert tiles.query_blocks(768, 1000, 256) == [] and tiles.key_blocks(0, 256, 256) == []
    assert tiles.query_blocks(0, 256, 256) == [256, 512, 768] and tiles.key_blocks(768, 1000, 256) == [0, 256, 512]


def test_a_row_blocked_in_its_first_key_block_keeps_its_max_at_minus_infinity_until_a_key_is_allowed():
    """Found by the grid's neighbours: a row with nothing allowed in the first key block it visits had its running
    max set to 0, not kept at -inf. Its later keys were then weighed against 0: one scoring below 0 never became j*
    (no pivot: a one-hot row's dq was rounding noise instead of exactly 0), and scores below -745 underflowed to
    ℓ = 0, a row taken as fully masked (zero context, lse -inf). An array mask and a structured one."""
    rng = np.random.default_rng(3)
    q, k, v, d_out = qkv_grad(rng, 1, 1, 4, 4, d=3)
    mask = np.ones((4, 4), bool)
    mask[1, :2] = False  # row 1: nothing in the first key block of 2, keys 2 and 3 in the second
    q[0, 0, 1] = -1000.0 * k[0, 0, 2:].mean(0) / np.abs(k[0, 0, 2:].mean(0)).sum()  # against keys 2 and 3
    for scale in (1.0, 2000.0):  # row 1's allowed scores -0.40 and -0.75, then -804 and -1492 (ℓ underflowed)
        chunked = run(kernels.ChunkedKernel(block_size=2, num_threads=1), q * scale / 1000, k, v, d_out, mask)
        vectorized = run(kernels.VectorizedKernel(), q * scale / 1000, k, v, d_out, mask)
        assert_same(chunked, vectorized, f"scale {scale}")
        np.testing.assert_allclose(chunked[1].lse, vectorized[1].lse, rtol=1e-13)
        assert chunked[1].jstar[0, 0, 1] in (2, 3)
    one_hot = StructuredMask(16, 12, window=1, offset=-1)  # each row one key (or none): dS = 0 exactly
    q, k, v, d_out = qkv_grad(rng, 1, 1, 16, 12, d=3)
    for block in (2, 3, 5):
        dq = run(kernels.ChunkedKernel(block_size=block, num_threads=1), q, k, v, d_out, one_hot)[2][0]
        assert not dq.any(), block


# --------------------------------------------------------------------------- flash-attention's window grid


def window_by_definition(Lq, Lk, left, right, align):
    """(Lq, Lk) bool, True = may attend, read off flash-attention's ``construct_local_mask`` (there True = masked):
    query i at p = i + Lk - Lq (bottom-right; p = i top-left) may attend to key j when p - left <= j <= p + right;
    None here is flash-attention's -1 (no bound on that side), so that -1 can be an offset."""
    p = np.arange(Lq)[:, None] + (Lk - Lq if align == "bottom-right" else 0)  # (Lq, 1)
    j = np.arange(Lk)[None, :]  # (1, Lk)
    allowed = np.ones((Lq, Lk), bool)
    if left is not None:
        allowed &= j >= p - left
    if right is not None:
        allowed &= j <= p + right
    return allowed


def window_mask(Lq, Lk, left, right, align) -> StructuredMask:
    """The window (left, right) as our masks give it: a causal mask with diagonal = right, a causal window of
    left + right + 1 keys ending at p + right, or (no right bound) a symmetric window wide enough to pass the last
    key; nothing allowed when left + right < 0."""
    if left is None:
        return StructuredMask(Lq, Lk) if right is None else masks.causal_mask(Lq, Lk, right, align, structured=True)
    if right is None:
        w = Lq + Lk + abs(left) + 1  # p + (w - left - 1) + w - 1 >= Lk - 1 for every p >= -Lq: no upper bound
        return masks.sliding_window_mask(Lq, Lk, w, causal=False, offset=w - left - 1, align=align, structured=True)
    if left + right < 0:
        return StructuredMask(Lq, Lk, keys=np.zeros((1, Lk), bool))
    return masks.sliding_window_mask(Lq, Lk, left + right + 1, offset=right, align=align, structured=True)


WINDOWS = [
    (None, None), (None, 0), (None, -3), (None, 2), (0, 0), (3, 0), (2, 5), (6, -2), (0, None), (4, None),
    (-2, 5), (-4, None), (2, -5),
]  # fmt: skip  # (left, right): flash's causal is (left, 0); None: unbounded (flash's -1); negatives: offsets
SEQLENS = [(1, 1), (1, 13), (13, 1), (7, 7), (5, 23), (23, 5), (9, 30), (30, 9)]  # Lq != Lk both ways, Lk > Lq + w
BLOCKS = [dict(block_size=2, num_threads=1), dict(block_size=3, num_threads=2), dict(block_size=5, num_threads=1)]


@pytest.mark.parametrize("Lq, Lk", SEQLENS)
def test_flash_attention_window_grid_on_the_chunked_kernel(Lq, Lk):
    """Every window, both causal alignments, blocks of 2, 3 and 5 (two threads: key ranges split): the mask's
    entries equal the definition, and the chunked forward and backward equal the vectorized kernel's, unseen rows
    and keys exactly 0."""
    rng = np.random.default_rng(Lq * 100 + Lk)
    q, k, v, d_out = qkv_grad(rng, 2, 2, Lq, Lk, d=4)
    vectorized = kernels.VectorizedKernel()
    for left, right in WINDOWS:
        for align in masks.ALIGNS:
            label = f"window ({left}, {right}), {align}, Lq={Lq}, Lk={Lk}"
            m = window_mask(Lq, Lk, left, right, align)
            dense = window_by_definition(Lq, Lk, left, right, align)
            np.testing.assert_array_equal(np.asarray(m)[0, 0], dense, err_msg=label)
            expected = run(vectorized, q, k, v, d_out, m)
            for opts in BLOCKS:
                chunked = run(kernels.ChunkedKernel(**opts), q, k, v, d_out, m)
                assert_same(chunked, expected, f"{label}, {opts}")
                assert_unseen_are_zero(dense, *chunked, f"{label}, {opts}")
