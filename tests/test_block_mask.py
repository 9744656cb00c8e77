"""FlexAttention's block masks (issue 36): ``block_mask.create_block_mask`` and its ``BlockMask``.

- the fields (kv_* / full_kv_* and their q_* transposes) against torch's ``create_block_mask`` on the CPU for a few
  mask_mods (causal, sliding window, document, per-batch prefix, per-head window; B = None / H = None), its entries
  against torch's ``create_mask``;
- ``masks.causal_mod``, ``window_mod``, ``document_mod``, ``prefix_lm_mod``: their block masks hold the entries of
  today's masks; ``and_masks`` / ``or_masks`` / ``noop_mask``;
- every kernel and ``MultiHeadAttention`` take a BlockMask: the chunked kernel (block = BLOCK_SIZE, another block,
  a BLOCK_SIZE of two sides) equal to the vectorized kernel with the dense mask, outputs and gradients, float64;
- the chunked kernel visits only the listed blocks and calls the mask_mod on the partial ones only;
- a document + causal block mask at L = 32768: O(L·d) memory, no (L, L) array;
- bad input: a ValueError naming the argument.
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from helpers import require_torch

from mha_numpy import MultiHeadAttention, kernels, masks
from mha_numpy.block_mask import BlockMask, and_masks, create_block_mask, noop_mask, or_masks
from mha_numpy.masks import EMPTY, FULL, PARTIAL

FIELDS = ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices",
          "q_num_blocks", "q_indices", "full_q_num_blocks", "full_q_indices")  # fmt: skip
LENGTHS = [70, 0, 33, 120]  # 223 positions: at L = 240 the last 17 belong to no document (fully masked rows)


def torch_cases(torch):
    """name -> (our mask_mod, torch's twin, B, H, Q_LEN, KV_LEN, BLOCK_SIZE); the twins written for torch alone."""
    doc = torch.tensor(np.repeat(np.arange(len(LENGTHS)), LENGTHS))  # (223,) each position's document
    doc = torch.cat([doc, torch.full((17,), -1)])  # (240,) -1: no document
    prefix = torch.tensor([40, 130])

    def torch_document(b, h, q, kv):
        return (doc[q] == doc[kv]) & (doc[q] >= 0)

    return {
        "causal": (masks.causal_mod, lambda b, h, q, kv: q >= kv, None, None, 300, 260, 64),
        "window": (masks.window_mod(50), lambda b, h, q, kv: (q - kv >= 0) & (q - kv < 50), None, None, 257, 257, 32),
        "bottom-right": (masks.window_mod(None, offset=90 - 200), lambda b, h, q, kv: kv <= q + 90 - 200,
                         None, 1, 200, 90, 32),
        "document": (masks.document_mod(LENGTHS), torch_document, 1, None, 240, 240, (32, 16)),
        "prefix per item": (masks.prefix_lm_mod([40, 130]), lambda b, h, q, kv: (kv < prefix[b]) | (kv <= q),
                            2, None, 200, 200, 32),
        "window per head, causal": (lambda b, h, q, kv: (q - kv >= 0) & (q - kv < 30 * (h + 1)),
                                    lambda b, h, q, kv: (q - kv >= 0) & (q - kv < 30 * (h + 1)), 2, 3, 160, 160, 32),
    }  # fmt: skip


@pytest.mark.parametrize("name", ["causal", "window", "bottom-right", "document", "prefix per item",
                                  "window per head, causal"])  # fmt: skip
def test_fields_and_entries_equal_torchs_create_block_mask(name):
    """Every field (values, shape, int32), shape and BLOCK_SIZE as torch 2.13's create_block_mask on the CPU gives
    them, and the entries (np.asarray) as torch's create_mask of the same mask_mod."""
    torch = require_torch()
    from torch.nn.attention import flex_attention as tf

    ours, theirs, B, H, Lq, Lk, bs = torch_cases(torch)[name]
    bm = create_block_mask(ours, B, H, Lq, Lk, device="cpu", BLOCK_SIZE=bs)
    ref = tf.create_block_mask(theirs, B, H, Lq, Lk, device="cpu", BLOCK_SIZE=bs)
    for field in FIELDS:
        got, want = getattr(bm, field), getattr(ref, field).numpy()
        assert got.dtype == np.int32 and got.shape == want.shape, (field, got.shape, want.shape)
        np.testing.assert_array_equal(got, want, err_msg=field)
    assert bm.shape == tuple(ref.shape) and bm.BLOCK_SIZE == tuple(ref.BLOCK_SIZE) and bm.mask_mod is ours
    np.testing.assert_array_equal(bm.to_dense(), ref.to_dense().numpy())
    dense = tf.create_mask(theirs, B or 1, H or 1, Lq, Lk, device="cpu").numpy()  # (B, H, Lq, Lk)
    np.testing.assert_array_equal(np.asarray(bm), dense)


def test_the_mods_of_todays_masks_give_their_entries():
    """causal (top-left, bottom-right, a diagonal), windows (causal, symmetric, shifted), documents (with positions
    past them, empty documents), prefix-LM (an int, one per item), document + causal by and_masks: the BlockMask's
    entries are the StructuredMask's, for blocks that do not divide the lengths."""
    L, Lq, Lk = 100, 37, 90
    cases = [
        (masks.causal_mod, masks.causal_mask(L, structured=True), L, L),
        (masks.window_mod(None, offset=Lk - Lq), masks.causal_mask(Lq, Lk, align="bottom-right"), Lq, Lk),
        (masks.window_mod(None, offset=-3), masks.causal_mask(Lq, Lk, diagonal=-3), Lq, Lk),
        (masks.window_mod(7), masks.sliding_window_mask(L, L, 7, structured=True), L, L),
        (masks.window_mod(5, causal=False, offset=4), masks.sliding_window_mask(Lq, Lk, 5, False, offset=4), Lq, Lk),
        (masks.window_mod(None, causal=False), np.ones((Lq, Lk), bool), Lq, Lk),
        (masks.document_mod(LENGTHS), masks.document_mask(LENGTHS, L=240, structured=True), 240, 240),
        (and_masks(masks.document_mod(LENGTHS), masks.causal_mod), masks.document_mask(LENGTHS, True, L=240), 240, 240),
        (masks.prefix_lm_mod(13), masks.prefix_lm_mask(L, 13, structured=True), L, L),
        (masks.prefix_lm_mod([13, 60]), masks.prefix_lm_mask(L, np.array([13, 60])), L, L),
    ]  # fmt: skip
    for n, (mod, structured, q_len, kv_len) in enumerate(cases):
        want = np.asarray(structured)  # (b, 1, Lq, Lk) or (Lq, Lk)
        want = want.reshape((1,) * (4 - want.ndim) + want.shape)
        bm = create_block_mask(mod, want.shape[0], None, q_len, kv_len, BLOCK_SIZE=16)
        np.testing.assert_array_equal(np.asarray(bm), want, err_msg=str(n))


def test_a_structured_mask_as_a_mask_mod_gives_its_entries():
    """StructuredMask.as_mask_mod(): documents per batch item with a prefix each, a window and key padding; its block
    mask holds the rule's entries, and the mod called on scattered indices (not a rectangle) gives them too."""
    keys = masks.padding_mask(np.array([90, 70]), 90)
    documents, prefix = [np.array([50, 40]), np.array([20, 0, 60])], [np.array([3, 4]), np.array([2, 0, 9])]
    rule = masks.StructuredMask(80, 90, causal=True, window=30, align="bottom-right", keys=keys, documents=documents,
                                prefix=prefix)  # fmt: skip
    want = np.asarray(rule)  # (2, 1, 80, 90)
    np.testing.assert_array_equal(np.asarray(create_block_mask(rule.as_mask_mod(), 2, None, 80, 90, BLOCK_SIZE=16)),
                                  want)  # fmt: skip
    b, q, kv = np.array([1, 0, 1])[:, None], np.array([[79], [3], [40]]), np.array([[89, 0, 41, 61]])
    np.testing.assert_array_equal(rule.as_mask_mod()(b, 0, q, kv), want[b, 0, q, kv])


def test_and_or_noop_compose_as_their_entries():
    """and_masks / or_masks: the entries' AND / OR; noop_mask: every entry, every whole block full (an edge block
    padded by torch's rule: partial); and of one mod is itself."""
    L = 70
    a, b = masks.window_mod(9), masks.prefix_lm_mod(20)
    ea, eb = (np.asarray(create_block_mask(m, None, None, L, L, BLOCK_SIZE=16)) for m in (a, b))
    np.testing.assert_array_equal(np.asarray(create_block_mask(and_masks(a, b), None, None, L, L, BLOCK_SIZE=16)),
                                  ea & eb)  # fmt: skip
    np.testing.assert_array_equal(np.asarray(create_block_mask(or_masks(a, b), None, None, L, L, BLOCK_SIZE=16)),
                                  ea | eb)  # fmt: skip
    noop = create_block_mask(noop_mask, 2, 2, L, L, BLOCK_SIZE=16)
    assert np.asarray(noop).all() and np.asarray(noop).shape == (2, 2, L, L)
    np.testing.assert_array_equal(noop.states[..., :4, :4], FULL)
    assert (noop.states[..., 4, :] == PARTIAL).all() and (noop.states[..., :, 4] == PARTIAL).all()  # 70 = 4·16 + 6


def test_and_with_padding_and_selecting_heads_keep_a_block_mask():
    """bm & padding_mask(...), bm & other_bm, rule & bm, combine_masks(bm, rule, padding): a BlockMask of the
    entries' AND; bm[:, 1:3], bm[1, 2]: the entries of those batch items and heads (the mod sees the original b, h)."""
    bm = create_block_mask(per_head_case(), 2, 3, 100, 100, BLOCK_SIZE=16)
    pad = masks.padding_mask(np.array([100, 80]), 100)  # (2, 1, 1, 100)
    window = create_block_mask(masks.window_mod(30, causal=False), None, None, 100, 100, BLOCK_SIZE=16)
    for combined, want in ((bm & pad, np.asarray(bm) & pad), (bm & window, np.asarray(bm) & np.asarray(window))):
        assert isinstance(combined, BlockMask) and combined.shape == (2, 3, 100, 100)
        np.testing.assert_array_equal(np.asarray(combined), want)
    rule = masks.StructuredMask(100, causal=True, documents=np.array([60, 40]), prefix=np.array([5, 8]))
    both = np.asarray(bm) & np.asarray(rule)  # (2, 3, 100, 100)
    for combined, want in ((rule & bm, both), (masks.combine_masks(rule, pad, bm), both & pad)):  # rule first: the
        # subclass's __rand__ is asked first (Python's rule for a subclass), so the BlockMask combines, per head
        assert isinstance(combined, BlockMask) and combined.shape == (2, 3, 100, 100)  # per head, not head 0's alone
        np.testing.assert_array_equal(np.asarray(combined), want)
    np.testing.assert_array_equal(np.asarray(bm[:, 1:3]), np.asarray(bm)[:, 1:3])
    np.testing.assert_array_equal(np.asarray(bm[1, 2]), np.asarray(bm)[1:2, 2:3])


def per_head_case():
    """A BlockMask that differs per batch item and per head, with empty, full and partial blocks and fully masked
    rows: document (per item: shifted) + a causal window as wide as the head allows."""

    def mod(b, h, q, kv):
        doc_q, doc_kv = (q + 7 * b) // 45, (kv + 7 * b) // 45  # documents of 45 positions, shifted per item
        return (doc_q == doc_kv) & (q - kv >= 0) & (q - kv < 20 + 20 * h) & (q < 90)  # rows past 90: no key

    return mod


@pytest.mark.parametrize("block, bs", [(None, 16), (None, (8, 16)), (24, 16), (8, 16)])
def test_the_chunked_kernel_with_a_block_mask_equals_the_vectorized_with_its_entries(block, bs):
    """B = 2, H = 3, L = 100, float64: output and dq, dk, dv of the chunked kernel given the BlockMask (its tiles
    BLOCK_SIZE, also (8, 16): 8 queries × 16 keys; a block of 24 or 8 across the mask's blocks) equal the
    vectorized kernel's given np.asarray(block_mask), to 1e-12; the dense mask itself equals the mask_mod's
    entries."""
    rng = np.random.default_rng(1)
    B, H, L, d = 2, 3, 100, 5
    q, k, v, d_out = (rng.standard_normal((B, H, L, d)) for _ in range(4))
    mod = per_head_case()
    bm = create_block_mask(mod, B, H, L, L, BLOCK_SIZE=bs)
    dense = np.asarray(bm)
    b, h, i, j = np.ix_(range(B), range(H), range(L), range(L))
    np.testing.assert_array_equal(dense, np.broadcast_to(mod(b, h, i, j), dense.shape))
    assert {EMPTY, FULL, PARTIAL} <= set(np.unique(bm.states)) and not dense[:, :, 90:].any()
    ref_out, ref_cache = kernels.get_kernel("vectorized").forward(q, k, v, mask=dense)
    ref = (ref_out, *ref_cache.kernel.backward(d_out, ref_cache)[:3])
    chunked = kernels.ChunkedKernel(block_size=block, num_threads=2)
    out, cache = chunked.forward(q, k, v, mask=bm)
    got = (out, *chunked.backward(d_out, cache)[:3])
    tile = (block, block) if block else (bs, bs) if isinstance(bs, int) else bs  # BLOCK_SIZE: its tile, two sides too
    assert chunked.tile(q.dtype, bm) == tile
    assert {(i0 % tile[0], j0 % tile[1], i1 - i0 <= tile[0], j1 - j0 <= tile[1]) for *_, i0, i1, j0, j1 in
            cache.tile_states} == {(0, 0, True, True)}  # every tile looked up is one of the grid's  # fmt: skip
    for name, x, y in zip(("out", "dq", "dk", "dv"), got, ref):
        np.testing.assert_allclose(x, y, rtol=0, atol=1e-12 * np.abs(y).max(), err_msg=name)
    assert not out[:, :, 90:].any() and not got[1][:, :, 90:].any()  # fully masked rows: zero, not NaN


def test_two_sided_tiles_split_keys_and_dropout_as_the_vectorized_kernel():
    """One head (the backward's key blocks split between 2 threads), BLOCK_SIZE (8, 24), sampled dropout (drawn per
    8 × 24 tile) and sinks: output and gradients equal the vectorized kernel's given the dense mask and the keep-mask
    the chunked cache assembles, float64, 1e-12."""
    rng = np.random.default_rng(5)
    L, d = 100, 4
    q, k, v, d_out = (rng.standard_normal((1, 1, L, d)) for _ in range(4))
    bm = create_block_mask(per_head_case(), 1, 1, L, L, BLOCK_SIZE=(8, 24))
    chunked, sinks = kernels.ChunkedKernel(num_threads=2), np.array([0.3])
    out, cache = chunked.forward(q, k, v, mask=bm, dropout_p=0.2, rng=0, sinks=sinks)
    got = (out, *chunked.backward(d_out, cache)[:3])
    vec = kernels.get_kernel("vectorized")
    ref_out, ref_cache = vec.forward(q, k, v, mask=np.asarray(bm), dropout_mask=cache.dropout_mask, dropout_p=0.2,
                                     sinks=sinks)  # fmt: skip
    ref = (ref_out, *vec.backward(d_out, ref_cache)[:3])
    assert chunked.tile(q.dtype, bm) == (8, 24)
    for name, x, y in zip(("out", "dq", "dk", "dv"), got, ref):
        np.testing.assert_allclose(x, y, rtol=0, atol=1e-12 * np.abs(y).max(), err_msg=name)


def test_the_chunked_kernel_visits_the_listed_blocks_and_calls_the_mod_on_partial_ones_only():
    """A local window with global keys (Longformer's pattern: each block row lists block 0 and its diagonal, with
    unlisted blocks between them): the chunked kernel's forward and backward look up the listed blocks' tiles only,
    and call the mask_mod only on (16, 16) rectangles of partial blocks."""
    L, calls = 128, []
    inner = or_masks(masks.window_mod(10), lambda b, h, q, kv: kv < 4)

    def mod(b, h, q, kv):
        calls.append((int(q.min()), int(q.max()) + 1, int(kv.min()), int(kv.max()) + 1))
        return inner(b, h, q, kv)

    bm = create_block_mask(mod, None, None, L, L, BLOCK_SIZE=16)
    listed = {tuple(rc) for rc in np.argwhere(bm.states[0, 0] != EMPTY)}  # (block row, block column)
    assert (7, 3) not in listed and (7, 0) in listed  # a gap in the span of a block row
    calls.clear()
    rng = np.random.default_rng(2)
    q, k, v = (rng.standard_normal((1, 1, L, 4)) for _ in range(3))
    chunked = kernels.ChunkedKernel(num_threads=1)
    out, cache = chunked.forward(q, k, v, mask=bm)
    chunked.backward(np.ones_like(out), cache)
    assert calls, "no partial block was computed"
    for i0, i1, j0, j1 in calls:
        assert (i1 - i0, j1 - j0) == (16, 16) and bm.states[0, 0, i0 // 16, j0 // 16] == PARTIAL, (i0, j0)
    looked = {(i0 // 16, j0 // 16) for _, _, i0, _, j0, _ in cache.tile_states}
    assert looked == listed, sorted(looked ^ listed)


def test_multi_head_attention_takes_a_block_mask_per_head():
    """MultiHeadAttention.forward(mask=block_mask) with a mask per batch item and head: the output and every
    gradient equal those with the dense entries (chunked, also with recompute=True or appended keys, vectorized,
    naive), float64, 1e-12."""
    rng = np.random.default_rng(3)
    B, H, L, E = 2, 3, 100, 12
    bm = create_block_mask(per_head_case(), B, H, L, L, BLOCK_SIZE=16)
    x, d_out = rng.standard_normal((B, L, E)), rng.standard_normal((B, L, E))
    options = {"recompute": True}, {"add_bias_kv": True, "add_zero_attn": True}, {}  # head groups (bm[:, hs]); keys
    for impl, kw in [("chunked", o) for o in options] + [("vectorized", {}), ("naive", {})]:  # appended to the mask
        mha = MultiHeadAttention(E, H, rng=0, impl=impl, **kw)
        out, cache = mha.forward(x, x, x, mask=bm)
        grads = mha.backward(d_out, cache)
        ref_out, ref_cache = mha.forward(x, x, x, mask=np.asarray(bm))
        ref = mha.backward(d_out, ref_cache)
        np.testing.assert_allclose(out, ref_out, rtol=0, atol=1e-12 * np.abs(ref_out).max(), err_msg=f"{impl} {kw}")
        scale = max(np.abs(np.asarray(g)).max() for g in ref.values())  # a gradient zero in theory (the key
        for name in ref:  # projection's bias) is judged against the largest one
            np.testing.assert_allclose(grads[name], ref[name], rtol=0, atol=1e-12 * scale, err_msg=name)


def test_a_document_causal_block_mask_at_32768_holds_o_l_d_memory():
    """L = 32768, H = 1, d = 8, documents of 4096: the mask's entries would be 1 GiB (L² bytes). create_block_mask
    and the chunked forward together peak far below (under 16 · L·d·8 bytes = 32 MiB: O(L·d), plus the (L / 128)²
    block states and one block row of the mask_mod, 128 · L), and the last rows equal attention over their own
    document alone."""
    L, d, n = 32768, 8, 4096
    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal((1, 1, L, d)) for _ in range(3))
    tracemalloc.start()
    try:
        bm = create_block_mask(and_masks(masks.document_mod([n] * (L // n)), masks.causal_mod), None, None, L, L)
        ctx, _ = kernels.ChunkedKernel(num_threads=2).forward(q, k, v, mask=bm)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 * L * d * 8, f"{peak / 2**20:.1f} MiB"  # 32 MiB: 1/32 of the entries' L² bytes
    assert (bm.states != EMPTY).sum() == (L // n) * (n // 128) * (n // 128 + 1) // 2  # the documents' diagonals
    rows, keys = slice(L - 100, L), slice(L - n, L)  # the last document, by the plain formula
    s = q[0, 0, rows] @ k[0, 0, keys].T / np.sqrt(d)  # (100, d) @ (d, n) -> (100, n)
    s = np.where(masks.causal_mask(100, n, align="bottom-right"), s, -np.inf)
    p = np.exp(s - s.max(axis=1, keepdims=True))
    np.testing.assert_allclose(ctx[0, 0, rows], (p / p.sum(axis=1, keepdims=True)) @ v[0, 0, keys], rtol=1e-12)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: create_block_mask(lambda b, h, q, kv: q - kv, 1, 1, 8, 8), "mask_mod must return a bool"),
        (lambda: create_block_mask(lambda b, h, q, kv: (q >= kv).astype(int), 1, 1, 8, 8), "mask_mod must return"),
        (lambda: create_block_mask(lambda b, h, q, kv: np.ones((3, 3), bool), 1, 1, 8, 8), "mask_mod returned shape"),
        (lambda: create_block_mask(lambda b, h, q, kv: 1 / 0, 1, 1, 8, 8), "mask_mod raised ZeroDivisionError"),
        (lambda: create_block_mask("causal", 1, 1, 8, 8), "mask_mod must be callable"),
        (lambda: create_block_mask(masks.causal_mod, 0, 1, 8, 8), "B"),
        (lambda: create_block_mask(masks.causal_mod, 1, 1.5, 8, 8), "H"),
        (lambda: create_block_mask(masks.causal_mod, 1, 1, 0, 8), "Q_LEN"),
        (lambda: create_block_mask(masks.causal_mod, 1, 1, 8, -1), "KV_LEN"),
        (lambda: create_block_mask(masks.causal_mod, 1, 1, 8, 8, BLOCK_SIZE=(4, 0)), r"BLOCK_SIZE\[1\]"),
        (lambda: create_block_mask(masks.causal_mod, 1, 1, 8, 8, BLOCK_SIZE=(4, 4, 4)), "BLOCK_SIZE"),
        (lambda: and_masks(masks.causal_mod, 3), "and_masks"),
        (lambda: or_masks(), "or_masks"),
        (lambda: masks.document_mod([[3, 4], [5, 2]]), "lengths"),
        (lambda: masks.window_mod(0), "window"),
        (lambda: masks.prefix_lm_mod(-1), "prefix"),
    ],
)
def test_bad_input_is_a_value_error_naming_the_argument(call, match):
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.parametrize("impl", ["chunked", "vectorized"])
def test_a_block_mask_of_other_sizes_is_refused_before_any_arithmetic(impl):
    """A BlockMask of other lengths, batch items or heads than the call's scores: ValueError naming the mask."""
    x = np.zeros((2, 3, 8, 4))
    for bm in (create_block_mask(masks.causal_mod, None, None, 8, 9, BLOCK_SIZE=4),
               create_block_mask(masks.causal_mod, 3, None, 8, 8, BLOCK_SIZE=4),
               create_block_mask(masks.causal_mod, None, 2, 8, 8, BLOCK_SIZE=4)):  # fmt: skip
        assert isinstance(bm, BlockMask)
        with pytest.raises(ValueError, match="mask is a StructuredMask of shape"):
            kernels.get_kernel(impl).forward(x, x, x, mask=bm)
