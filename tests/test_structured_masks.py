"""Masks that serve (issue 22, item 6): causal masks aligned top-left or bottom-right, document (packed) masks,
prefix-LM, and ``masks.StructuredMask``, the same masks given by their rule, whose tiles the chunked kernel
classifies without an (Lq, Lk) array.

- the rule: every entry against a loop written from the definition, and the tile states and ranges the chunked
  kernel reads against the entries (EMPTY and FULL exact, the ranges bounding every allowed entry);
- every kernel with a StructuredMask equal to the same kernel with its entries (bit for bit) and to an einsum
  reference, outputs and every gradient; finite differences; recompute, appended keys, the KV cache;
- bottom-right causal against SDPA's ``causal_lower_right`` (outputs and gradients, float64, 1e-10); document
  masks against a per-document loop (torch SDPA on each document) and against transformers' packed-sequence mask;
- fully masked document rows: zero weights, zero context, zero gradients;
- the chunked kernel's memory at a long L with a structured window: O(L·d), measured with tracemalloc.
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from helpers import rel_err, require_torch
from reference import attention

from mha_numpy import KVCache, MultiHeadAttention, kernels, masks
from mha_numpy import functional as F
from mha_numpy.gradcheck import check_mha
from mha_numpy.masks import EMPTY, FULL, MIXED, StructuredMask

KERNEL_CASES = {
    "vectorized": {},
    "naive": {},
    "chunked-b3": dict(block_size=3, num_threads=1),
    "chunked-b4-t2": dict(block_size=4, num_threads=2),
    "auto": dict(min_chunked_scores=200),  # both of its kernels are reached at these shapes
}


def kernel(name):
    return kernels.get_kernel(name.split("-")[0], **KERNEL_CASES[name])


# --------------------------------------------------------------------------- the rule, from its definition


def by_definition(Lq, Lk, causal=False, window=None, offset=0, align="top-left", documents=None, prefix=0, keys=None,
                  B=1):  # fmt: skip
    """(B, 1, Lq, Lk) bool, one entry at a time, read off StructuredMask's docstring."""
    out = np.zeros((B, 1, Lq, Lk), bool)
    start = offset + (Lk - Lq if align == "bottom-right" else 0)
    for b in range(B):
        docs = None if documents is None else (documents[b] if isinstance(documents, list) else documents)
        bounds = None if docs is None else np.concatenate([[0], np.cumsum(docs)])

        def doc(x, bounds=bounds, docs=docs):
            if bounds is None:
                return 0
            return next((t for t in range(len(docs)) if bounds[t] <= x < bounds[t + 1]), None)

        for i in range(Lq):
            p = i + start
            for j in range(Lk):
                if doc(p) is None or doc(p) != doc(j) or (keys is not None and not keys[b, j]):
                    continue
                first = 0 if bounds is None else bounds[doc(j)]
                limit = prefix if np.ndim(prefix) == 0 else np.asarray(prefix)[b if docs is None else doc(j)]
                band = (not causal or p - j >= 0) and (
                    window is None or (p - j < window if causal else abs(p - j) < window)
                )
                out[b, 0, i, j] = band or ((causal or window is not None) and j - first < limit)
    return out


def cuts(rng, total_max):
    """Random document lengths (zero-length ones included) whose sum is at most total_max."""
    total = int(rng.integers(0, total_max + 1))
    edges = np.sort(np.concatenate([[0, total], rng.integers(0, total + 1, size=int(rng.integers(0, 3)))]))
    return np.diff(edges)


def random_rule(rng):
    Lq, Lk, B = int(rng.integers(1, 8)), int(rng.integers(1, 8)), int(rng.integers(1, 3))
    kw = dict(causal=bool(rng.integers(2)), window=[None, 1, 2, 3][rng.integers(4)], offset=int(rng.integers(-3, 4)),
              align=["top-left", "bottom-right"][rng.integers(2)])  # fmt: skip
    if rng.integers(2):
        kw["documents"] = cuts(rng, Lk) if B == 1 else [cuts(rng, Lk) for _ in range(B)]
        if rng.integers(2) and B == 1:  # one prefix per document
            kw["prefix"] = rng.integers(0, 3, size=len(kw["documents"]))
        elif rng.integers(2):
            kw["prefix"] = int(rng.integers(0, 3))
    elif rng.integers(2):
        kw["prefix"] = int(rng.integers(0, 4)) if B == 1 else rng.integers(0, 4, size=B)
    if rng.integers(2):
        kw["keys"] = rng.random((B, Lk)) < 0.8
    return Lq, Lk, B, kw


@pytest.mark.parametrize("seed", range(6))
def test_the_rule_gives_the_entries_of_its_definition_and_the_tiles_are_classified_exactly(seed):
    """Every entry; then, on every rectangle: EMPTY has no allowed entry, FULL no blocked one, MIXED both, ``tile``
    is the entries' rectangle, and ``key_range`` / ``query_range`` hold every allowed entry (the kernel visits no
    other)."""
    rng = np.random.default_rng(seed)
    states = []
    for _ in range(25):
        Lq, Lk, B, kw = random_rule(rng)
        m = StructuredMask(Lq, Lk, **kw)
        ref = by_definition(Lq, Lk, **kw, B=B)
        assert m.shape == (ref.shape[0] if m.batch > 1 else 1, 1, Lq, Lk)
        np.testing.assert_array_equal(np.broadcast_to(np.asarray(m), ref.shape), ref, err_msg=repr(kw))
        for b in range(B):
            for i0 in range(Lq):
                for i1 in range(i0 + 1, Lq + 1):
                    lo, hi = m.key_range(b, i0, i1)
                    assert not ref[b, 0, i0:i1, :lo].any() and not ref[b, 0, i0:i1, hi:].any(), kw
                    assert 0 <= lo <= hi <= Lk, kw  # inside the sequence (issue 35: past its end, a crash)
                    for j0 in range(Lk):
                        for j1 in range(j0 + 1, Lk + 1):
                            entries, state = ref[b, 0, i0:i1, j0:j1], m.classify(b, i0, i1, j0, j1)
                            assert (state != EMPTY or not entries.any()) and (state != FULL or entries.all()), kw
                            assert state != MIXED or (entries.any() and not entries.all()), kw
                            np.testing.assert_array_equal(m.tile(b, i0, i1, j0, j1), entries)
                            states.append(state)
            for j0 in range(Lk):
                for j1 in range(j0 + 1, Lk + 1):
                    lo, hi = m.query_range(b, j0, j1)
                    assert not ref[b, 0, :lo, j0:j1].any() and not ref[b, 0, hi:, j0:j1].any(), kw
                    assert 0 <= lo <= hi <= Lq, kw
    assert {EMPTY, FULL, MIXED} <= set(states)  # the rule decides most rectangles by itself


def test_causal_alignment_and_the_dense_helpers_follow_their_rules():
    # top-left (today's default, SDPA's is_causal) and bottom-right (the last query at the last key)
    np.testing.assert_array_equal(masks.causal_mask(2, 4), [[1, 0, 0, 0], [1, 1, 0, 0]])
    np.testing.assert_array_equal(masks.causal_mask(2, 4, align="bottom-right"), [[1, 1, 1, 0], [1, 1, 1, 1]])
    np.testing.assert_array_equal(masks.causal_mask(4, 2, align="bottom-right"), [[0, 0], [0, 0], [1, 0], [1, 1]])
    np.testing.assert_array_equal(masks.causal_mask(3, 5, align="bottom-right"), masks.causal_mask(3, 5, diagonal=2))
    np.testing.assert_array_equal(
        masks.sliding_window_mask(2, 6, 3, align="bottom-right"), masks.sliding_window_mask(2, 6, 3, offset=4)
    )
    for Lq, Lk in ((3, 5), (5, 3), (4, 4)):
        for align in masks.ALIGNS:
            for dense, structured in (
                (masks.causal_mask(Lq, Lk, 1, align), masks.causal_mask(Lq, Lk, 1, align, structured=True)),
                (masks.sliding_window_mask(Lq, Lk, 2, False, -1, align),
                 masks.sliding_window_mask(Lq, Lk, 2, False, -1, align, structured=True)),
            ):  # fmt: skip
                assert isinstance(structured, StructuredMask) and dense.shape == (Lq, Lk)
                np.testing.assert_array_equal(np.asarray(structured)[0, 0], dense)
    # documents: same document (and causal within it); positions past the documents attend to nothing
    docs = masks.document_mask([2, 3], causal=True, L=6)
    np.testing.assert_array_equal(docs, by_definition(6, 6, causal=True, documents=np.array([2, 3]))[0, 0])
    np.testing.assert_array_equal(docs[:2, :2], [[1, 0], [1, 1]])  # causal within the first document ...
    assert not docs[2:5, :2].any() and not docs[:2, 2:].any()  # ... and nothing across documents
    assert not docs[5].any() and not docs[:, 5].any()  # the padding position: a fully masked row and column
    batched = masks.document_mask([np.array([2, 2]), np.array([4])])
    assert batched.shape == (2, 1, 4, 4) and batched[1].all() and not batched[0, 0, 0, 2]
    # prefix-LM: the prefix attends to itself both ways, the rest causally
    plm = masks.prefix_lm_mask(5, 2)
    np.testing.assert_array_equal(plm, np.tril(np.ones((5, 5), bool)) | (np.arange(5) < 2))
    assert masks.prefix_lm_mask(5, [1, 3]).shape == (2, 1, 5, 5)
    assert isinstance(masks.prefix_lm_mask(5, 2, structured=True), StructuredMask)


def test_combining_keeps_the_structure_and_equals_the_entries_combined():
    rng = np.random.default_rng(0)
    pad = masks.padding_mask(np.array([7, 4]), 7)  # (2, 1, 1, 7)
    window = masks.sliding_window_mask(5, 7, 3, align="bottom-right", structured=True)
    docs = StructuredMask(5, 7, documents=np.array([3, 4]), align="bottom-right")
    for combined, entries in (
        (window & pad, np.asarray(window) & pad),
        (pad & window, pad & np.asarray(window)),  # the array's & hands over to the mask (no entries built)
        (window & docs, np.asarray(window) & np.asarray(docs)),
        (masks.combine_masks(window, None, pad, docs), np.asarray(window) & pad & np.asarray(docs)),
    ):
        assert isinstance(combined, StructuredMask) and combined.shape == entries.shape
        np.testing.assert_array_equal(np.asarray(combined), entries)
    bias = rng.normal(size=(5, 7))  # any other mask: the entries are built, and combined as arrays
    np.testing.assert_array_equal(masks.combine_masks(window, bias), masks.combine_masks(np.asarray(window), bias))
    more = window.append_keys(2)  # torch's add_bias_kv / add_zero_attn: every query may attend to them
    assert more.shape == (1, 1, 5, 9)
    np.testing.assert_array_equal(np.asarray(more)[0, 0, :, 7:], True)
    np.testing.assert_array_equal(np.asarray(more)[0, 0, :, :7], np.asarray(window)[0, 0])
    assert "window=3" in repr(window) and "bottom-right" in repr(window)
    assert window.nbytes < 5 * 7 * 8 + 200 and masks.sliding_window_mask(4096, 4096, 8, structured=True).nbytes < 2**16


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: StructuredMask(3, 4, align="bottom"), "align must be 'top-left' or 'bottom-right'"),
        (lambda: StructuredMask(3, 4, window=0), "window must be a positive int"),
        (lambda: StructuredMask(3, 4, offset=1.5), "offset must be an int"),
        (lambda: StructuredMask(3, 4, causal=1), "causal must be True or False"),
        (lambda: StructuredMask(3, 4, documents=[3, 2]), r"documents\[0\] covers 5 positions, more than the Lk = 4"),
        (lambda: StructuredMask(3, 4, documents=[2.0]), "documents must hold non-negative ints"),
        (lambda: StructuredMask(3, 4, documents=[-1, 2]), "documents must hold non-negative ints"),
        (lambda: StructuredMask(3, 4, causal=True, documents=[2, 2], prefix=[1]), "one value per document"),
        (lambda: StructuredMask(3, 4, causal=True, prefix=-1), "prefix must be a non-negative int"),
        (lambda: StructuredMask(3, 4, keys=np.ones((2, 5), bool)), r"keys must be a bool key padding mask"),
        (lambda: StructuredMask(3, 4, documents=[[1], [2], [3]], keys=np.ones((2, 4), bool)), "batch sizes differ"),
        (lambda: StructuredMask(3, 4) & np.ones((3, 4), bool), "combines with another one or with a bool key"),
        (lambda: StructuredMask(3, 4) & StructuredMask(3, 5), "do not combine"),
        (lambda: masks.causal_mask(3, 4, align="left", structured=True), "align must be"),
        (lambda: masks.causal_mask(3, 4, structured=1), "structured must be True or False"),
        (lambda: masks.document_mask([2, 2], causal="yes"), "causal must be True or False"),
    ],
)
def test_bad_arguments_are_value_errors_naming_them(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_a_call_refuses_a_structured_mask_of_another_shape_before_any_arithmetic():
    mha = MultiHeadAttention(8, 2, rng=0)
    x = np.zeros((2, 5, 8))
    for bad in (StructuredMask(5, 6), StructuredMask(4, 5), StructuredMask(5, keys=np.ones((3, 5), bool))):
        with pytest.raises(ValueError, match=r"mask is a StructuredMask of shape .* need \(1 or B, 1, Lq, Lk\)"):
            mha.forward(x, x, x, mask=bad)
        with pytest.raises(ValueError, match="mask"):
            kernels.ChunkedKernel().forward(np.zeros((2, 1, 5, 2)), np.zeros((2, 1, 5, 2)), np.zeros((2, 1, 5, 2)),
                                            mask=bad)  # fmt: skip


# --------------------------------------------------------------------------- every kernel: structure = entries

B, H, E = 2, 4, 16


def case_masks(Lq, Lk):
    """StructuredMasks of every kind for scores (B, ·, Lq, Lk), with fully masked rows among them."""
    pad = masks.padding_mask(np.array([Lk, Lk - 3]), Lk)
    out = {
        "causal bottom-right": masks.causal_mask(Lq, Lk, align="bottom-right", structured=True),
        "window top-left + padding": masks.sliding_window_mask(Lq, Lk, 3, structured=True) & pad,
        "symmetric window": masks.sliding_window_mask(Lq, Lk, 2, causal=False, offset=-1, structured=True),
        "documents per item, causal": StructuredMask(Lq, Lk, causal=True, align="bottom-right",
                                                     documents=[np.array([3, 0, Lk - 5]), np.array([Lk - 2])]),
        "documents, bidirectional, prefix-LM": StructuredMask(Lq, Lk, causal=True, documents=np.array([4, Lk - 4]),
                                                              prefix=np.array([2, 3])),
        "prefix per item + window": StructuredMask(Lq, Lk, causal=True, window=2, prefix=np.array([1, 4])),
    }  # fmt: skip
    return out


def module_grads(mha, x, kv, mask, d_out):
    out, cache = mha.forward(x, kv, kv, mask=mask)
    return out, cache, mha.backward(d_out, cache)


@pytest.mark.parametrize("impl", list(KERNEL_CASES))
@pytest.mark.parametrize("Lq, Lk", [(9, 9), (6, 11)])
def test_every_kernel_gives_with_the_rule_what_it_gives_with_the_entries(impl, Lq, Lk):
    """Outputs, weights and every gradient: bit for bit the same as with ``np.asarray(mask)`` (a chunked kernel
    skips and builds the very tiles it would find in the array), and equal to the einsum reference."""
    rng = np.random.default_rng(0)
    x, kv = rng.standard_normal((B, Lq, E)), rng.standard_normal((B, Lk, E))
    mha = MultiHeadAttention(E, H, rng=0, impl=kernel(impl))
    d_out = rng.standard_normal((B, Lq, E))
    for name, m in case_masks(Lq, Lk).items():
        dense = np.asarray(m)
        out, cache, grads = module_grads(mha, x, kv, m, d_out)
        out_d, cache_d, grads_d = module_grads(mha, x, kv, dense, d_out)
        np.testing.assert_array_equal(out, out_d, err_msg=name)
        np.testing.assert_array_equal(cache.attn_weights, cache_d.attn_weights, err_msg=name)
        for key in grads:
            np.testing.assert_array_equal(grads[key], grads_d[key], err_msg=f"{name}: {key}")
        P = mha.params
        Q, K, V = ((a @ P[f"W_{n}"].T + P[f"b_{n}"]).reshape(B, -1, H, E // H).transpose(0, 2, 1, 3)
                   for n, a in (("q", x), ("k", kv), ("v", kv)))  # fmt: skip
        ctx, w = attention(Q, K, V, dense)
        assert rel_err(cache.attn_weights, w) < 1e-13, name
        assert rel_err(out, ctx.transpose(0, 2, 1, 3).reshape(B, Lq, E) @ P["W_o"].T + P["b_o"]) < 1e-13, name
        rows = ~np.broadcast_to(dense, w.shape).any(-1)  # (B, H, Lq) fully masked rows
        if rows.any():
            assert not cache.attn_weights[rows].any() and np.isfinite(grads["query"]).all(), name


FD_MASKS = ["documents per item, causal", "window top-left + padding", "documents, bidirectional, prefix-LM"]


@pytest.mark.parametrize("impl", list(KERNEL_CASES))
def test_gradients_by_finite_differences_with_structured_masks(impl):
    """Central differences against a random upstream gradient, every input and parameter (a small module: each
    entry of every parameter costs two forwards); one mask per kernel, the three on the vectorized one."""
    rng = np.random.default_rng(1)
    x, kv = rng.standard_normal((B, 6, 8)), rng.standard_normal((B, 8, 8))
    mha = MultiHeadAttention(8, 2, rng=0, impl=kernel(impl))
    names = FD_MASKS if impl == "vectorized" else [FD_MASKS[list(KERNEL_CASES).index(impl) % len(FD_MASKS)]]
    for name in names:
        report = check_mha(mha, x, kv, kv, mask=case_masks(6, 8)[name], rng=2)
        assert report.passed and max(row.max_rel_err for row in report.rows) < 1e-7, f"{name}\n{report}"


@pytest.mark.parametrize("impl", ["vectorized", "chunked-b3", "chunked-b4-t2"])
def test_recompute_gqa_rope_appended_keys_and_float32_keep_working_with_the_rule(impl):
    """The module's steps that touch the mask: recompute cuts it per head group (it is shared by the heads),
    add_bias_kv / add_zero_attn append allowed keys (``append_keys``); float32 stays float32."""
    rng = np.random.default_rng(2)
    L = 10
    m = StructuredMask(L, causal=True, window=4, documents=np.array([3, 7])) & masks.padding_mask(np.array([10, 8]))
    for opts in (dict(recompute=True, num_kv_heads=2, rope_theta=100.0), dict(add_bias_kv=True, add_zero_attn=True),
                 dict(recompute=True, add_bias_kv=True), dict(dtype=np.float32, num_kv_heads=1)):  # fmt: skip
        mha = MultiHeadAttention(E, H, rng=0, impl=kernel(impl), **opts)
        x = rng.standard_normal((B, L, E)).astype(mha.dtype)
        d_out = rng.standard_normal((B, L, E)).astype(mha.dtype)
        out, _, grads = module_grads(mha, x, x, m, d_out)
        out_d, _, grads_d = module_grads(mha, x, x, np.asarray(m), d_out)
        assert out.dtype == mha.dtype
        np.testing.assert_array_equal(out, out_d, err_msg=str(opts))
        for key in grads:
            np.testing.assert_array_equal(grads[key], grads_d[key], err_msg=f"{opts}: {key}")
        if not opts.get("recompute"):
            continue
        plain = MultiHeadAttention(E, H, rng=0, impl=kernel(impl), **{**opts, "recompute": False})
        out_p, _, grads_p = module_grads(plain, x, x, m, d_out)
        assert rel_err(out, out_p) < 1e-13 and max(rel_err(grads[k], grads_p[k]) for k in grads) < 1e-12


@pytest.mark.parametrize("impl", ["vectorized", "naive", "chunked-b3", "chunked-b4-t2"])
def test_decoding_and_chunked_prefill_with_bottom_right_masks_equal_the_full_forward(impl):
    """The KV cache needs bottom-right: a call's Lq queries are the last of its Lk keys. Chunks of 1, 3 and 5
    tokens (chunked prefill), each with its own bottom-right window or document mask, give the full forward;
    without a mask the cache's own causal mask is a StructuredMask too."""
    rng = np.random.default_rng(3)
    L, docs = 12, np.array([5, 4, 3])
    x = rng.standard_normal((B, L, E))
    mha = MultiHeadAttention(E, H, rng=0, num_kv_heads=2, rope_theta=50.0, impl=kernel(impl))
    for rule in (dict(window=3), dict(documents=docs), {}):
        full, _ = mha.forward(x, x, x, mask=StructuredMask(L, causal=True, **rule))
        kv, outs, t = KVCache(), [], 0
        for n in (1, 3, 1, 5, 2):
            xt = x[:, t : t + n]
            so_far = {}
            if "documents" in rule:  # the documents up to position t + n: the last one cut there
                so_far["documents"] = np.diff(np.concatenate([[0], np.minimum(np.cumsum(docs), t + n)]))
            elif rule:
                so_far = rule
            mask = StructuredMask(n, t + n, causal=True, align="bottom-right", **so_far) if rule else None
            outs.append(mha.forward(xt, xt, xt, kv_cache=kv, mask=mask)[0])
            t += n
        assert rel_err(np.concatenate(outs, axis=1), full) < 1e-13, rule


# --------------------------------------------------------------------------- against torch and transformers


def torch_sdpa(q, k, v, attn_mask, d_out):
    torch = require_torch()
    tq, tk, tv = (torch.from_numpy(a).requires_grad_() for a in (q, k, v))
    out = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, attn_mask=attn_mask)
    grads = torch.autograd.grad(out, (tq, tk, tv), torch.from_numpy(d_out))
    return out.detach().numpy(), [g.numpy() for g in grads]


@pytest.mark.filterwarnings("ignore:Lower right causal bias will produce NaNs")  # it gives zeros (checked here)
@pytest.mark.parametrize("impl", list(KERNEL_CASES))
@pytest.mark.parametrize("Lq, Lk", [(5, 9), (9, 5), (7, 7)])
def test_bottom_right_causal_equals_sdpa_causal_lower_right_and_top_left_causal_upper_left(impl, Lq, Lk):
    """Outputs and the gradients of q, k, v to 1e-10 in float64, against torch autograd; Lq > Lk bottom-right has
    fully masked rows, where SDPA gives zeros as we do (though causal_lower_right warns it gives NaN)."""
    require_torch()
    from torch.nn.attention.bias import causal_lower_right, causal_upper_left

    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal((B, 3, n, 4)) for n in (Lq, Lk, Lk))
    d_out = rng.standard_normal((B, 3, Lq, 4))
    for align, bias in (("bottom-right", causal_lower_right(Lq, Lk)), ("top-left", causal_upper_left(Lq, Lk))):
        np.testing.assert_array_equal(masks.causal_mask(Lq, Lk, align=align), bias._materialize().numpy())
        out_t, grads_t = torch_sdpa(q, k, v, bias, d_out)
        for mask in (masks.causal_mask(Lq, Lk, align=align, structured=True), masks.causal_mask(Lq, Lk, align=align)):
            ctx, cache = kernel(impl).forward(q, k, v, mask=mask)
            dq, dk, dv = cache.kernel.backward(d_out, cache)[:3]
            assert rel_err(ctx, out_t) < 1e-10, (align, type(mask))
            for ours, theirs in zip((dq, dk, dv), grads_t):
                assert rel_err(ours, theirs) < 1e-10, (align, type(mask))
        ctx_f, _ = F.scaled_dot_product_attention(q, k, v, masks.causal_mask(Lq, Lk, align=align, structured=True))
        assert rel_err(ctx_f, out_t) < 1e-10  # functional's sdpa takes it too (and builds its entries)
        if Lq > Lk and align == "bottom-right":
            assert not out_t[:, :, : Lq - Lk].any() and not ctx[:, :, : Lq - Lk].any()  # zeros, not NaN


@pytest.mark.parametrize("impl", list(KERNEL_CASES))
@pytest.mark.parametrize("causal", [True, False])
def test_document_masks_equal_a_per_document_loop_on_torch(impl, causal):
    """Packed documents of 3, 0, 6, 2 tokens and 2 positions of padding after them (fully masked rows, which get
    zero context and zero gradients): each document attended on its own by torch SDPA (is_causal within it)."""
    require_torch()
    rng = np.random.default_rng(5)
    docs, L = np.array([3, 0, 6, 2]), 13
    q, k, v = (rng.standard_normal((B, 3, L, 4)) for _ in range(3))
    d_out = rng.standard_normal((B, 3, L, 4))
    mask = masks.document_mask(docs, causal=causal, L=L, structured=True)
    ctx, cache = kernel(impl).forward(q, k, v, mask=mask)
    grads = cache.kernel.backward(d_out, cache)[:3]
    ref_ctx, ref_grads = np.zeros_like(ctx), [np.zeros_like(a) for a in (q, k, v)]
    for start, n in zip(np.cumsum(docs) - docs, docs):
        if n == 0:
            continue
        sl = slice(start, start + n)
        torch_mask = masks.causal_mask(n) if causal else None
        out_t, grads_t = torch_sdpa(*(np.ascontiguousarray(a[:, :, sl]) for a in (q, k, v)),
                                    None if torch_mask is None else _tensor(torch_mask),
                                    np.ascontiguousarray(d_out[:, :, sl]))  # fmt: skip
        ref_ctx[:, :, sl] = out_t
        for r, g in zip(ref_grads, grads_t):
            r[:, :, sl] = g
    assert rel_err(ctx, ref_ctx) < 1e-10
    for ours, theirs in zip(grads, ref_grads):
        assert rel_err(ours, theirs) < 1e-10
    padding = slice(int(docs.sum()), L)  # positions after the documents: no document, nothing to attend to
    assert not ctx[:, :, padding].any() and not grads[0][:, :, padding].any()
    assert not cache.attn_weights[:, :, padding].any() and not grads[1][:, :, padding].any()


def _tensor(a):
    import torch

    return torch.from_numpy(np.ascontiguousarray(a))


def test_document_causal_and_sliding_window_masks_equal_transformers_masks():
    """transformers.masking_utils builds its masks from functions of (batch, head, q_idx, kv_idx): its packed-sequence
    mask (documents found from position_ids that restart at 0), its sliding-window mask, and its causal mask with
    a cache (q_offset: bottom-right) give our entries."""
    require_torch()
    import torch

    mu = pytest.importorskip("transformers.masking_utils")
    docs = [np.array([3, 4, 2]), np.array([6, 3])]
    position_ids = torch.tensor(np.stack([np.concatenate([np.arange(n) for n in d]) for d in docs]))
    packed = mu.find_packed_sequence_indices(position_ids)
    theirs = mu.sdpa_mask(2, 9, 9, mask_function=mu.and_masks(mu.causal_mask_function,
                          mu.packed_sequence_mask_function(packed)), allow_is_causal_skip=False)  # fmt: skip
    np.testing.assert_array_equal(np.asarray(masks.document_mask(docs, causal=True, structured=True)), theirs.numpy())
    window = mu.sdpa_mask(1, 4, 10, q_offset=6, mask_function=mu.sliding_window_causal_mask_function(3),
                          allow_is_causal_skip=False)  # fmt: skip  # 4 new tokens after a cache of 6
    ours = masks.sliding_window_mask(4, 10, 3, align="bottom-right", structured=True)
    np.testing.assert_array_equal(np.asarray(ours), window.numpy())
    causal = mu.sdpa_mask(1, 3, 8, q_offset=5, allow_is_causal_skip=False)
    np.testing.assert_array_equal(masks.causal_mask(3, 8, align="bottom-right"), causal.numpy()[0, 0])


# --------------------------------------------------------------------------- the chunked kernel: memory, tiles


def chunked_peak(L, d, window, block):
    """tracemalloc peak (bytes) of a chunked forward + backward with a structured causal window, B = H = 1,
    float64, and the number of tile states it looked up; the inputs are made before tracing starts."""
    rng = np.random.default_rng(6)
    q, k, v = (rng.standard_normal((1, 1, L, d)) for _ in range(3))
    d_out = rng.standard_normal((1, 1, L, d))
    kern = kernels.ChunkedKernel(block_size=block, num_threads=2)
    tracemalloc.start()
    try:
        mask = masks.sliding_window_mask(L, L, window, structured=True)
        ctx, cache = kern.forward(q, k, v, mask=mask)
        grads = kern.backward(d_out, cache)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return peak, len(cache.tile_states), ctx, grads, (q, k, v, d_out)


def test_the_chunked_kernel_holds_o_l_d_memory_with_a_structured_window_at_a_long_length():
    """L = 32768, d = 16, window 64: the window's entries would be 1 GiB (L² bytes); the kernel's peak stays within
    a constant times L·d·8 bytes and grows linearly with L (4 × L: under 4.5 × the peak), and it looks up O(L)
    tile states (a window visits the tiles along its band, not all (L / block)²)."""
    L, d, w, block = 32768, 16, 64, 128
    small, small_states = chunked_peak(L // 4, d, w, block)[:2]
    peak, states, ctx, (dq, dk, dv, *_), (q, k, v, d_out) = chunked_peak(L, d, w, block)
    assert peak < 24 * L * d * 8, f"{peak / 2**20:.1f} MiB"  # the inputs, outputs and gradients are 7 · L·d·8
    assert peak < 4.5 * small, (peak, small)
    assert states < 12 * (L // block) and states < 4.5 * small_states, states  # the band's tiles, their parts
    rows = slice(L - 200, L)  # the last rows, against the attention of their window alone
    keys = slice(L - 200 - w + 1, L)
    ref, _ = attention(q[:, :, rows], k[:, :, keys], v[:, :, keys],
                       masks.sliding_window_mask(200, 200 + w - 1, w, align="bottom-right"))  # fmt: skip
    assert rel_err(ctx[:, :, rows], ref) < 1e-13


def test_the_chunked_kernel_skips_exactly_the_tiles_the_entries_skip():
    """The tile states found from the rule (and the entries of its partial tiles) are those found in the array:
    the same tiles are skipped, computed without a mask and cut into parts."""
    rng = np.random.default_rng(7)
    L = 40
    q, k, v = (rng.standard_normal((2, 2, L, 3)) for _ in range(3))
    for m in (masks.sliding_window_mask(L, L, 6, structured=True), StructuredMask(L, documents=np.array([9, 20, 5])),
              StructuredMask(L, causal=True, prefix=7) & masks.padding_mask(np.array([40, 31]))):  # fmt: skip
        kern = kernels.ChunkedKernel(block_size=4, num_threads=1)
        rule, entries = kern.forward(q, k, v, mask=m)[1], kern.forward(q, k, v, mask=np.asarray(m))[1]
        kern.backward(np.ones((2, 2, L, 3)), rule)
        kern.backward(np.ones((2, 2, L, 3)), entries)
        visited = {key: state for key, state in rule.tile_states.items()}
        for key, state in visited.items():
            assert entries.tile_states.get(key, state) == state, key
        skipped = {key for key, (s, _) in entries.tile_states.items() if s != EMPTY} - set(visited)
        assert not skipped  # every tile with work in the array was visited from the rule too


def test_a_band_builds_each_of_its_tiles_once_and_keeps_a_bounded_few_read_only():
    """A causal window's tile depends only on p_i0 - j0 and its shape: the chunked kernel asks for the same few
    tiles again and again (the diagonal, the window's edge, their quarters, forward and backward). The rule builds
    each once and hands out the kept one, read-only (the kernel only reads it), at most masks.BAND_TILES of at
    most masks.BAND_TILE_BYTES; masks with documents, a prefix, keys or another mask build theirs every time."""
    L, w = 2048, 200
    m = masks.sliding_window_mask(L, L, w, structured=True)
    dense = np.asarray(m)[0, 0]
    t = m.tile(0, 512, 640, 256, 384)  # p_i0 - j0 = 256, (128, 128)
    assert np.array_equal(t, dense[512:640, 256:384]) and not t.flags.writeable
    again = m.tile(0, 1024, 1152, 768, 896)  # the same p_i0 - j0 and shape further down the band
    assert again is t and np.array_equal(again, dense[1024:1152, 768:896])
    with pytest.raises(ValueError):
        t[0, 0] = not t[0, 0]
    rng = np.random.default_rng(8)
    q, k, v, d_out = (rng.standard_normal((1, 2, L, 8)) for _ in range(4))
    kern = kernels.ChunkedKernel(block_size=64, num_threads=2)
    ctx, cache = kern.forward(q, k, v, mask=m)
    grads = kern.backward(d_out, cache)
    ref_ctx, ref_cache = kern.forward(q, k, v, mask=dense)
    assert np.array_equal(ctx, ref_ctx)
    assert all(np.array_equal(a, b) for a, b in zip(grads, kern.backward(d_out, ref_cache)))
    kept = m._band_tiles
    assert 0 < len(kept) <= masks.BAND_TILES and all(x.nbytes <= masks.BAND_TILE_BYTES for x in kept.values())
    docs = StructuredMask(L, causal=True, documents=np.array([1000, 1048]))
    assert docs.tile(0, 0, 64, 0, 64) is not docs.tile(0, 0, 64, 0, 64) and not docs._band_tiles
