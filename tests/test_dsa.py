"""DeepSeek Sparse Attention (``mha_numpy.sparse``, issue 39): the lightning indexer, top-k selection, attention over
the selected keys only, the indexer's KL loss, decoding, and the refusals.

- the indexer's scores against transformers' ``DeepseekV32Indexer`` (its float32 casts lifted, float64; its
  half-split RoPE), its gradients against torch autograd of the same lines and by central differences;
- top-k's rules (k >= Lk, ties by lower index, masked keys never) against a brute-force sort;
- the gathered attention against torch autograd of dense attention with the selection as a mask, every gradient, and
  by central differences; a query with no key; its memory (never Lq x Lk); float32 stays float32;
- ``DeepSeekSparseAttention`` against ``DeepseekV32Attention``: output, selection, the input's and every MLA
  parameter's gradient to 1e-10; the same selection on the dense kernels (``TopKSelection`` is a mask);
- the indexer's loss (dense warm-up and sparse stage) against torch autograd and central differences;
- decoding with the indexer's keys beside MLA's latent cache == the full forward to 1e-12;
- bad input: k <= 0, an indexer of the wrong width, a selection with a masked key; nothing mutated.
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from helpers import grad_check, grad_check_self_attention, rel_err, require_torch

from mha_numpy import kernels
from mha_numpy import masks as M
from mha_numpy.sparse.dsa import DeepSeekSparseAttention, DSACache
from mha_numpy.sparse.indexer import IndexerConfig, indexer_backward, indexer_forward
from mha_numpy.sparse.indexer_loss import indexer_loss_backward, indexer_loss_forward, indexer_target
from mha_numpy.sparse.sparse_attention import SparseKernel, sparse_attention_backward, sparse_attention_forward
from mha_numpy.sparse.topk import TopKSelection, topk_select

INDEXER = IndexerConfig(num_heads=3, head_dim=6, rope_dim=4, rope_theta=50.0)
E, RQ, B, L = 10, 5, 2, 7
INDEXER_PARAMS = ("W_iq", "W_ik", "ik_norm", "ik_norm_b", "W_iw")


def indexer_case(seed=0, dtype=np.float64):
    """x (B, L, E), q_resid (B, L, rq) and indexer parameters with a nonzero norm bias and non-unit weights."""
    rng = np.random.default_rng(seed)
    p = INDEXER.init_params(E, RQ, rng, dtype)
    p["ik_norm"] = (1.0 + 0.2 * rng.standard_normal(p["ik_norm"].shape)).astype(dtype)
    p["ik_norm_b"] = (0.3 * rng.standard_normal(p["ik_norm_b"].shape)).astype(dtype)
    x, q_resid = rng.standard_normal((B, L, E)).astype(dtype), rng.standard_normal((B, L, RQ)).astype(dtype)
    return x, q_resid, p


def hf_indexer_as_ours(torch, p, c=INDEXER, embed_dim=E, rq=RQ):
    """A transformers DeepseekV32Indexer (float64) holding the parameters ``p`` of the indexer ``c``."""
    from transformers import DeepseekV32Config
    from transformers.models.deepseek_v32.modeling_deepseek_v32 import DeepseekV32Indexer

    cfg = DeepseekV32Config(hidden_size=embed_dim, q_lora_rank=rq, index_n_heads=c.num_heads,
                            qk_rope_head_dim=c.rope_dim, index_head_dim=c.head_dim, num_hidden_layers=1, vocab_size=8,
                            n_group=1,
                            topk_group=1, n_routed_experts=2, num_experts_per_tok=1)  # fmt: skip
    module = DeepseekV32Indexer(cfg, 0).to(torch.float64)
    names = {"W_iq": "wq_b.weight", "W_ik": "wk.weight", "ik_norm": "k_norm.weight", "ik_norm_b": "k_norm.bias",
             "W_iw": "weights_proj.weight"}  # fmt: skip
    with torch.no_grad():
        for ours, theirs in names.items():
            module.get_parameter(theirs).copy_(torch.from_numpy(p[ours]))
    return module, names


def torch_cos_sin(torch, L, dr=4, theta=50.0):
    from mha_numpy.interop.llama import torch_cos_sin as cos_sin

    return cos_sin(torch, np.broadcast_to(np.arange(L), (B, L)), dr, theta, np.float64)


# --------------------------------------------------------------------------- 1. the indexer


def test_indexer_scores_and_gradients_match_deepseek_v32_indexer_and_torch_autograd():
    """Our I = Σ_h w_h relu(q_h·k/√dI) (half-split RoPE on the first dr features, LayerNorm'd key, weights · nI^-1/2)
    against DeepseekV32Indexer's lines (casts lifted), and every gradient against torch autograd of those lines."""
    torch = require_torch()
    pytest.importorskip("transformers")
    from mha_numpy.interop.deepseek_v32 import indexer_scores_lifted

    x, q_resid, p = indexer_case()
    module, names = hf_indexer_as_ours(torch, p)
    I, cache = indexer_forward(x, q_resid, p, INDEXER)  # noqa: E741
    tx, tq = torch.from_numpy(x).requires_grad_(), torch.from_numpy(q_resid).requires_grad_()
    zero = torch.zeros((B, L, L), dtype=torch.float64)  # no mask: every score compared
    theirs = indexer_scores_lifted(module, tx, tq, torch_cos_sin(torch, L), zero)
    assert rel_err(I, theirs.detach().numpy()) < 1e-13
    G = np.random.default_rng(1).standard_normal(I.shape)
    grads = indexer_backward(G, cache)
    leaves = [tx, tq, *(module.get_parameter(names[n]) for n in INDEXER_PARAMS)]
    t_grads = torch.autograd.grad(theirs, leaves, torch.from_numpy(G))
    for name, tg in zip(("x", "q_resid", *INDEXER_PARAMS), t_grads):
        assert rel_err(grads[name], tg.numpy()) < 1e-12, name


def test_indexer_gradients_by_central_differences():
    x, q_resid, p = indexer_case(seed=2)

    def forward(x, q_resid, **params):
        return indexer_forward(x, q_resid, params, INDEXER)

    def backward(d, cache):
        g = indexer_backward(d, cache)
        return tuple(g[n] for n in ("x", "q_resid", *INDEXER_PARAMS))

    grad_check(forward, backward, dict(x=x, q_resid=q_resid, **p), ["x", "q_resid", *INDEXER_PARAMS])


# --------------------------------------------------------------------------- 2. top-k and the sparse attention


def brute_topk(scores, k, allowed):
    """Each row's allowed keys sorted by (-score, index), the first k, ascending; -1 padded."""
    B_, Lq, Lk = scores.shape
    k = min(k, Lk)
    out = np.full((B_, Lq, k), -1)
    for b in range(B_):
        for i in range(Lq):
            keys = sorted((j for j in range(Lk) if allowed[b, i, j]), key=lambda j: (-scores[b, i, j], j))[:k]
            out[b, i, : len(keys)] = sorted(keys)
    return out


@pytest.mark.parametrize("k", [1, 3, 6, 9, 50])
def test_topk_rules_against_a_brute_force_sort(k):
    """Scores with many exact ties (small integers), a causal mask and a random one, several block sizes: ties go to
    the lower key index, masked keys never, k >= Lk keeps every allowed key."""
    rng = np.random.default_rng(k)
    scores = rng.integers(-2, 3, size=(2, 9, 9)).astype(np.float64)
    for mask in (M.causal_mask(9), rng.random((2, 9, 9)) < 0.5, None):
        allowed = np.broadcast_to(np.ones((9, 9), bool) if mask is None else mask, scores.shape)
        expected = brute_topk(scores, k, allowed)
        for block in (1, 4, 256):
            assert np.array_equal(topk_select(scores, k, mask, block_size=block), expected)
    high = np.where(M.causal_mask(9), 0.0, 100.0)[None]  # the masked keys score highest: still never chosen
    assert np.array_equal(topk_select(high, 2, M.causal_mask(9)), brute_topk(high, 2, M.causal_mask(9)[None]))
    structured = topk_select(scores, k, M.causal_mask(9, structured=True))
    assert np.array_equal(structured, brute_topk(scores, k, np.broadcast_to(M.causal_mask(9), scores.shape)))


def sparse_case(seed=0, dtype=np.float64, H=4, Hk=2, Lq=7, Lk=9, k=4, d=5, dv=3):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, H, Lq, d)).astype(dtype)
    kk = rng.standard_normal((B, Hk, Lk, d)).astype(dtype)
    v = rng.standard_normal((B, Hk, Lk, dv)).astype(dtype)
    mask = M.causal_mask(Lq, Lk, diagonal=Lk - Lq)
    index = topk_select(rng.standard_normal((B, Lq, Lk)), k, mask)  # (B, Lq, k), -1 in the first rows
    return q, kk, v, index


def test_sparse_attention_matches_torch_autograd_of_dense_attention_with_the_selection_as_mask():
    torch = require_torch()
    q, k, v, index = sparse_case()
    H, Hk = q.shape[1], k.shape[1]
    context, cache = sparse_attention_forward(q, k, v, index, scale=0.7, block_size=3)
    d_ctx = np.random.default_rng(3).standard_normal(context.shape)
    dq, dk, dv = sparse_attention_backward(d_ctx, cache)
    allowed = np.asarray(TopKSelection(index, k.shape[2]))  # (B, 1, Lq, Lk)
    tq, tk, tv = (torch.from_numpy(a).requires_grad_() for a in (q, k, v))
    rep = lambda t: t.repeat_interleave(H // Hk, dim=1)  # noqa: E731  key head j serves query heads j·g ...
    s = (tq @ rep(tk).transpose(-1, -2) * 0.7).masked_fill(~torch.from_numpy(allowed), float("-inf"))
    out = torch.softmax(s, dim=-1) @ rep(tv)
    t_grads = torch.autograd.grad(out, (tq, tk, tv), torch.from_numpy(d_ctx))
    assert rel_err(context, out.detach().numpy()) < 1e-13
    for ours, theirs in zip((dq, dk, dv), t_grads):
        assert rel_err(ours, theirs.numpy()) < 1e-12
    assert rel_err(cache.lse, torch.logsumexp(s, dim=-1).detach().numpy()) < 1e-13
    unchosen = ~np.asarray(TopKSelection(index, k.shape[2]))[:, 0].any(axis=1)  # (B, Lk) keys no query chose
    assert unchosen.any() and np.all(dk.transpose(0, 2, 1, 3)[unchosen] == 0)  # exactly 0: never touched


def test_sparse_attention_by_central_differences_and_a_query_with_no_key():
    q, k, v, index = sparse_case(seed=4, Lq=4, Lk=5, k=2, d=3, dv=2, H=2, Hk=1)
    index = index.copy()
    index[1, 2] = -1  # query 2 of item 1 selects nothing: zero context, zero gradients, no NaN
    grad_check(lambda q, k, v: sparse_attention_forward(q, k, v, index, block_size=2), sparse_attention_backward,
               dict(q=q, k=k, v=v), ["q", "k", "v"])  # fmt: skip
    context, cache = sparse_attention_forward(q, k, v, index)
    dq, _, _ = sparse_attention_backward(np.ones_like(context), cache)
    assert np.all(context[1, :, 2] == 0) and np.all(dq[1, :, 2] == 0) and np.isneginf(cache.lse[1, :, 2]).all()


def test_sparse_attention_memory_is_o_of_l_times_k_not_l_squared():
    """k = 16, blocks of 32 queries: the forward + backward peak grows with L (x 4 from L = 1024 to 4096, not x 16)
    and stays far below one (L, L) float64 array (128 MiB at L = 4096)."""
    peaks = {}
    for L_ in (1024, 4096):
        rng = np.random.default_rng(0)
        q, kk, v = (rng.standard_normal((1, 1, L_, 8)) for _ in range(3))
        index = np.sort(rng.integers(0, L_, (1, L_, 64)), axis=-1)[..., ::4]  # (1, L, 16) ascending
        index = np.where(np.diff(index, axis=-1, prepend=-1) > 0, index, -1)  # a repeat -> -1
        tracemalloc.start()
        context, cache = sparse_attention_forward(q, kk, v, index, block_size=32)
        sparse_attention_backward(np.ones_like(context), cache)
        peaks[L_] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert peaks[4096] < 4.5 * peaks[1024] and peaks[4096] < 4096**2 * 8 / 32, peaks


def test_the_index_is_stored_as_int32():
    """topk_select, TopKSelection (from an int64 index too), the sparse cache and DSA's selection keep int32 (half of
    int64's bytes; transformers' indexer returns int32), and an int32 index goes through the kernel uncopied."""
    q, k, v, index = sparse_case()
    assert index.dtype == np.int32
    sel = TopKSelection(index.astype(np.int64), k.shape[2])
    assert sel.index.dtype == np.int32 and sel.nbytes == index.size * 4
    _, cache = sparse_attention_forward(q, k, v, index)
    assert cache.index.dtype == np.int32 and np.shares_memory(cache.index, index)
    _, call = small_dsa().forward(np.random.default_rng(0).standard_normal((2, 5, 12)))
    assert call.selection.index.dtype == np.int32 and call.mla.attention.index.dtype == np.int32


def test_float32_stays_float32():
    q, k, v, index = sparse_case(dtype=np.float32)
    context, cache = sparse_attention_forward(q, k, v, index)
    grads = sparse_attention_backward(np.ones_like(context), cache)
    assert context.dtype == np.float32 and all(g.dtype == np.float32 for g in grads) and cache.lse.dtype == np.float64
    ref, _ = sparse_attention_forward(*(a.astype(np.float64) for a in (q, k, v)), index)
    assert rel_err(context, ref) < 1e-5


@pytest.mark.parametrize("impl", ["vectorized", "naive", "chunked"])
def test_a_selection_is_a_mask_every_kernel_takes(impl):
    """``TopKSelection`` as the mask of a dense kernel (its entries, or the chunked kernel's tiles) gives the sparse
    kernel's output and gradients: one design for "visit only these keys"."""
    q, k, v, index = sparse_case(H=2, Hk=2)
    sel = TopKSelection(index, k.shape[2])
    dense = kernels.get_kernel(impl, **({"block_size": 2} if impl == "chunked" else {}))
    ref, rc = dense.forward(q, k, v, mask=sel)
    out, c = SparseKernel(block_size=3).forward(q, k, v, mask=sel)
    d = np.random.default_rng(0).standard_normal(out.shape)
    assert rel_err(out, ref) < 1e-13
    for ours, theirs in zip(SparseKernel().backward(d, c)[:3], dense.backward(d, rc)[:3]):
        assert rel_err(ours, theirs) < 1e-12
    assert rel_err(c.attn_weights, rc.attn_weights) < 1e-13


def test_deepseek_sparse_attention_matches_deepseek_v32_attention():
    """Output, the indexer's scores, the selection, dL/dx and every MLA parameter's gradient against
    DeepseekV32Attention under torch autograd, float64, to 1e-10; the inputs have no tie at the k-th score."""
    require_torch()
    pytest.importorskip("transformers")
    from mha_numpy.interop.deepseek_v32 import (
        crosscheck_hf_deepseek_v32_attention,
        from_hf_deepseek_v32_attention,
        hf_deepseek_v32_attention,
        selection_margin,
    )

    module = hf_deepseek_v32_attention(index_topk=4)
    x = np.random.default_rng(0).standard_normal((2, 10, 16))
    report = crosscheck_hf_deepseek_v32_attention(module, x)
    assert report.passed, str(report)
    dsa = from_hf_deepseek_v32_attention(module)
    scores, _ = indexer_forward(x, dsa.query_latent(x), dsa.indexer_params, dsa.indexer)
    assert selection_margin(scores, M.causal_mask(10), 4) > 1e-3  # no tie at the k-th score: one right selection
    assert sum(1 for r in report.rows if r.name.startswith("dL/d")) == 11  # dx and the 10 MLA parameters


def test_deepseek_sparse_attention_matches_deepseek_v32_attention_as_shipped_in_float32():
    """float32, DeepseekV32Attention as shipped (its casts, the indexer's .float() and the norms' and softmax's float32,
    are no-ops there): output, the indexer's scores, the selection, dL/dx and every MLA gradient to 1e-5 relative;
    ours stays float32 throughout."""
    require_torch()
    pytest.importorskip("transformers")
    from mha_numpy.interop.deepseek_v32 import (
        crosscheck_hf_deepseek_v32_attention,
        from_hf_deepseek_v32_attention,
        hf_deepseek_v32_attention,
        selection_margin,
    )

    module = hf_deepseek_v32_attention(index_topk=4, dtype=np.float32)
    x = np.random.default_rng(1).standard_normal((2, 10, 16)).astype(np.float32)
    report = crosscheck_hf_deepseek_v32_attention(module, x, rtol=1e-5)
    assert report.passed, str(report)
    dsa = from_hf_deepseek_v32_attention(module)
    scores, _ = indexer_forward(x, dsa.query_latent(x), dsa.indexer_params, dsa.indexer)
    assert selection_margin(scores, M.causal_mask(10), 4) > 1e-2  # far above float32's rounding: one selection
    out, call = dsa.forward(x)
    grads = dsa.backward(np.ones_like(out), call)
    assert out.dtype == np.float32 and all(g.dtype == np.float32 for g in grads.values())


def test_float32_stays_float32_through_the_indexer_loss():
    """Both stages (the gathered sparse one too): the loss and every gradient float32, near float64's."""
    results = {}
    for dtype in (np.float64, np.float32):
        dsa = DeepSeekSparseAttention(12, 2, 6, 4, 3, 4, 5, index_n_heads=3, index_head_dim=6, index_topk=3, rng=0,
                                      dtype=dtype)  # fmt: skip
        x = np.random.default_rng(5).standard_normal((2, 8, 12)).astype(dtype)
        q_resid = dsa.query_latent(x)
        index, target = gathered_case(dsa, x)
        dense = loss_cases(dsa, x)[0]
        scores, s_dense = indexer_forward(x, q_resid, dsa.indexer_params, dsa.indexer)
        loss_d, l_dense = indexer_loss_forward(scores, dense[1], dense[2])
        loss_s, (s_sparse, l_sparse) = gathered_loss(dsa, x, q_resid, dsa.indexer_params, index, target)
        results[dtype] = [(loss_d, indexer_backward(indexer_loss_backward(1.0, l_dense), s_dense)),
                          (loss_s, indexer_backward(indexer_loss_backward(1.0, l_sparse), s_sparse))]  # fmt: skip
    for (loss32, g32), (loss64, g64) in zip(results[np.float32], results[np.float64]):
        assert loss32.dtype == np.float32 and abs(loss32 - loss64) < 1e-5 * abs(loss64)
        for name, g in g32.items():
            assert g.dtype == np.float32 and rel_err(g, g64[name]) < 1e-4, name


def test_deepseek_sparse_attention_gradients_by_central_differences():
    """MLA on the sparse kernel with the indexer's selection fixed: dL/dx and every MLA parameter's gradient."""
    dsa = small_dsa(seed=3)
    x = np.random.default_rng(9).standard_normal((2, 6, 12))
    _, call = dsa.forward(x)
    grad_check_self_attention(dsa.mla, x, mask=call.selection)


# --------------------------------------------------------------------------- 3. the indexer's loss


def small_dsa(seed=0, k=3):
    return DeepSeekSparseAttention(12, 2, 6, 4, 3, 4, 5, index_n_heads=3, index_head_dim=6, index_topk=k, rng=seed,
                                   bias=True)  # fmt: skip


def loss_cases(dsa, x):
    """(stage, target, mask): the dense warm-up (the dense causal MLA's weights, causal) and the sparse stage (the
    sparse attention's weights, the selection)."""
    _, call = dsa.forward(x)
    sparse_w = call.mla.attention.attn_weights  # (B, H, L, L), 0 off the selection
    dense_kernel = dsa.mla.kernel
    dsa.mla.kernel = "vectorized"
    _, dense = dsa.mla.forward(x, mask=M.causal_mask(x.shape[1]))
    dsa.mla.kernel = dense_kernel
    causal = M.causal_mask(x.shape[1])
    return [("dense", indexer_target(dense.attn_weights, causal), causal),
            ("sparse", indexer_target(sparse_w, call.selection), call.selection)]  # fmt: skip


def gathered_case(dsa, x):
    """The sparse stage slot by slot, O(L · k): (index (B, L, k), the target (B, L, k) from the sparse attention's
    selected weights)."""
    _, call = dsa.forward(x)
    index = call.selection.index
    return index, indexer_target(call.mla.attention.selected_weights(), index >= 0)


def gathered_loss(dsa, x, q_resid, params, index, target, block_size=None):
    """The sparse stage's loss and the indexer's gradients on the gathered path (scores (B, L, k) only)."""
    scores, s_cache = indexer_forward(x, q_resid, params, dsa.indexer, index=index, block_size=block_size)
    loss, l_cache = indexer_loss_forward(scores, target, index >= 0)
    return loss, (s_cache, l_cache)


def test_indexer_loss_against_torch_autograd_dense_and_sparse():
    """The whole chain (indexer lines of transformers, casts lifted -> KL) under torch autograd: the loss and the
    gradients of the indexer's parameters to 1e-12 in both stages."""
    torch = require_torch()
    pytest.importorskip("transformers")
    from mha_numpy.interop.deepseek_v32 import indexer_scores_lifted

    dsa = small_dsa()
    x = np.random.default_rng(5).standard_normal((2, 8, 12))
    L_ = x.shape[1]
    q_resid = dsa.query_latent(x)
    module, names = hf_indexer_as_ours(torch, dsa.indexer_params, dsa.indexer, 12, 5)
    cos_sin = torch_cos_sin(torch, L_, 4, 10000.0)
    for stage, target, mask in loss_cases(dsa, x):
        allowed = np.broadcast_to(np.asarray(mask)[:, 0] if mask.ndim == 4 else mask, (2, L_, L_))
        scores, s_cache = indexer_forward(x, q_resid, dsa.indexer_params, dsa.indexer)
        loss, l_cache = indexer_loss_forward(scores, target, mask)
        grads = indexer_backward(indexer_loss_backward(1.0, l_cache), s_cache)
        t_allowed = torch.from_numpy(np.array(allowed))
        tx, tq = torch.from_numpy(x), torch.from_numpy(q_resid)
        t_scores = indexer_scores_lifted(module, tx, tq, cos_sin, t_allowed)  # -inf where blocked
        log_q = torch.log_softmax(t_scores, dim=-1)
        p = torch.from_numpy(target)
        t_loss = torch.where(t_allowed, torch.special.xlogy(p, p) - p * log_q, 0.0).sum()
        leaves = [module.get_parameter(names[n]) for n in INDEXER_PARAMS]
        t_grads = torch.autograd.grad(t_loss, leaves)
        assert abs(loss - t_loss.item()) < 1e-12 * abs(t_loss.item()), stage
        for name, tg in zip(INDEXER_PARAMS, t_grads):
            assert rel_err(grads[name], tg.numpy()) < 1e-12, (stage, name)
        if stage == "sparse":  # the same loss and gradients gathered, scores (B, L, k), blocks of 3 queries
            index, target_sel = gathered_case(dsa, x)
            loss, (s_cache, l_cache) = gathered_loss(dsa, x, q_resid, dsa.indexer_params, index, target_sel, 3)
            grads = indexer_backward(indexer_loss_backward(1.0, l_cache), s_cache)
            assert abs(loss - t_loss.item()) < 1e-12 * abs(t_loss.item())
            for name, tg in zip(INDEXER_PARAMS, t_grads):
                assert rel_err(grads[name], tg.numpy()) < 1e-12, ("gathered", name)


def test_indexer_loss_by_central_differences():
    dsa = small_dsa(seed=1)
    x = np.random.default_rng(6).standard_normal((2, 6, 12))
    q_resid = dsa.query_latent(x)
    for _, target, mask in loss_cases(dsa, x):

        def forward(target=target, mask=mask, **params):
            scores, s_cache = indexer_forward(x, q_resid, params, dsa.indexer)
            loss, l_cache = indexer_loss_forward(scores, target, mask)
            return np.asarray(loss), (s_cache, l_cache)

        def backward(d, caches):
            g = indexer_backward(indexer_loss_backward(d, caches[1]), caches[0])
            return tuple(g[n] for n in INDEXER_PARAMS)

        grad_check(forward, backward, dict(dsa.indexer_params), list(INDEXER_PARAMS))
    index, target = gathered_case(dsa, x)

    def gathered(**params):
        loss, caches = gathered_loss(dsa, x, q_resid, params, index, target, block_size=4)
        return np.asarray(loss), caches

    grad_check(gathered, backward, dict(dsa.indexer_params), list(INDEXER_PARAMS))


def test_sparse_stage_indexer_loss_memory_is_o_of_l_times_k_not_l_squared():
    """The sparse stage's loss + backward on the gathered path, k = 16: its peak grows with L (x 4 from L = 1024 to
    4096, not x 16) and stays far below one (L, L) float64 array (128 MiB at L = 4096; the dense stage's scores, their
    softmax and relu each hold one)."""
    c = IndexerConfig(num_heads=2, head_dim=8, rope_dim=4)
    peaks = {}
    for L_ in (1024, 4096):
        rng = np.random.default_rng(0)
        p = c.init_params(8, 4, rng)
        x, q_resid = rng.standard_normal((1, L_, 8)), rng.standard_normal((1, L_, 4))
        index = np.sort(rng.integers(0, L_, (1, L_, 64)), axis=-1)[..., ::4]  # (1, L, 16) ascending
        index = np.where(np.diff(index, axis=-1, prepend=-1) > 0, index, -1)  # a repeat -> -1
        target = np.where(index >= 0, rng.random(index.shape), 0.0)
        target /= target.sum(axis=-1, keepdims=True)
        tracemalloc.start()
        scores, s_cache = indexer_forward(x, q_resid, p, c, index=index, block_size=32)
        _, l_cache = indexer_loss_forward(scores, target, index >= 0)
        indexer_backward(indexer_loss_backward(1.0, l_cache), s_cache)
        peaks[L_] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert peaks[4096] < 4.5 * peaks[1024] and peaks[4096] < 4096**2 * 8 / 16, peaks


def test_indexer_target_sums_heads_and_normalises_over_the_allowed_keys():
    w = np.random.default_rng(0).random((1, 3, 4, 4))
    sel = TopKSelection(np.array([[[0, -1], [0, 1], [1, 2], [0, 3]]]), 4)
    p = indexer_target(w, sel)
    expected = w.sum(axis=1) * np.asarray(sel)[:, 0]
    np.testing.assert_allclose(p, expected / expected.sum(axis=-1, keepdims=True), rtol=1e-15)
    loss, _ = indexer_loss_forward(np.log(p + (p == 0)), p, sel)  # the indexer already matches the target: KL = 0
    assert abs(loss) < 1e-15


# --------------------------------------------------------------------------- 4. decoding


@pytest.mark.parametrize("prefill, chunk", [(3, 1), (1, 2)])
def test_decoding_with_the_indexer_keys_beside_the_latent_cache_equals_the_full_forward(prefill, chunk):
    dsa = small_dsa(k=3)
    x = np.random.default_rng(7).standard_normal((2, 8, 12))
    full, call = dsa.forward(x)
    cache = DSACache()
    outs, index = [], []
    for a in [0, *range(prefill, 8, chunk)]:
        b = prefill if a == 0 else min(a + chunk, 8)
        out, c = dsa.forward(x[:, a:b], cache=cache)
        outs.append(out)
        index.append(np.pad(c.selection.index, ((0, 0), (0, 0), (0, 3 - c.selection.k)), constant_values=-1))
    assert np.abs(np.concatenate(outs, axis=1) - full).max() <= 1e-12 * np.abs(full).max()
    assert np.array_equal(np.concatenate(index, axis=1), call.selection.index)
    assert cache.index_keys.shape == (2, 8, 6) and len(cache) == 8
    assert cache.nbytes == 2 * 8 * (6 + 4 + 6) * 8  # r + dr + dI numbers a token


# --------------------------------------------------------------------------- 5. bad input


def test_k_must_be_positive():
    with pytest.raises(ValueError, match=r"^k must be"):
        topk_select(np.zeros((1, 2, 2)), 0)
    with pytest.raises(ValueError, match="index_topk"):
        small_dsa(k=0)
    with pytest.raises(ValueError, match="index_topk"):
        small_dsa(k=-3)


def test_an_indexer_of_the_wrong_width_is_refused_naming_the_parameter():
    x, q_resid, p = indexer_case()
    wide = dict(p, W_iq=np.zeros((3 * 7, RQ)))  # heads 7 wide, the config says 6
    with pytest.raises(ValueError, match=r"indexer param W_iq has shape \(21, 5\)"):
        indexer_forward(x, q_resid, wide, INDEXER)
    dsa = small_dsa()
    dsa.indexer_params["W_ik"] = np.zeros((5, 12))
    with pytest.raises(ValueError, match="indexer param W_ik"):
        dsa.forward(np.zeros((1, 3, 12)))
    with pytest.raises(ValueError, match="q_resid"):
        indexer_forward(x, q_resid[..., :-1], p, INDEXER)


def test_a_selection_with_a_masked_key_is_refused_and_nothing_is_mutated():
    q, k, v, index = sparse_case(Lq=5, Lk=5, H=2, Hk=2)
    bad = index.copy()
    bad[0, 1, 0] = 3  # query 1 selects the future key 3
    before = [a.copy() for a in (q, k, v, bad)]
    with pytest.raises(ValueError, match=r"^index selects key 3 for query 1 of batch item 0, which the mask blocks"):
        sparse_attention_forward(q, k, v, bad, mask=M.causal_mask(5))
    sel = TopKSelection(bad, 5)
    for combined in (sel & M.causal_mask(5, structured=True), M.causal_mask(5, structured=True) & sel):
        assert isinstance(combined, TopKSelection)
        with pytest.raises(ValueError, match=r"^mask selects key 3 for query 1"):
            SparseKernel().forward(q, k, v, mask=combined)
    with pytest.raises(ValueError, match="twice"):
        TopKSelection(np.array([[[1, 1]]]), 3)
    with pytest.raises(ValueError, match="outside"):
        TopKSelection(np.array([[[0, 3]]]), 3)
    with pytest.raises(ValueError, match="mask: the sparse kernel attends"):
        SparseKernel().forward(q, k, v, mask=M.causal_mask(5))
    assert all(np.array_equal(a, b) for a, b in zip(before, (q, k, v, bad)))


def test_indexer_loss_gradient_of_the_scores_with_a_row_without_mass():
    """∂L/∂I = softmax(I) · Σp - p: a query whose target has no mass (all its weights 0) adds 0 and gets 0."""
    rng = np.random.default_rng(8)
    scores, p = rng.standard_normal((2, 4, 5)), rng.random((2, 4, 5))
    p[1, 2] = 0.0
    p /= np.where(p.sum(-1, keepdims=True) > 0, p.sum(-1, keepdims=True), 1.0)
    grad_check(lambda scores: (np.asarray(indexer_loss_forward(scores, p)[0]), indexer_loss_forward(scores, p)[1]),
               indexer_loss_backward, dict(scores=scores), ["scores"])  # fmt: skip
    assert np.all(indexer_loss_backward(1.0, indexer_loss_forward(scores, p)[1])[1, 2] == 0)


def test_dsa_refuses_a_bad_mask_or_cache_before_any_arithmetic_and_keeps_its_cache():
    dsa = small_dsa()
    x = np.random.default_rng(0).standard_normal((2, 4, 12))
    cache = DSACache()
    dsa.forward(x[:, :3], cache=cache)
    kept = cache.index_keys.copy()
    with pytest.raises(ValueError, match=r"^mask with shape \(3, 3\)"):
        dsa.forward(x[:, 3:], mask=np.ones((3, 3), bool), cache=cache)  # the call has 1 query and 4 keys
    with pytest.raises(ValueError, match="^cache holds indexer keys"):
        dsa.forward(x[:1, 3:], cache=cache)  # one batch item, the cache two
    assert len(cache) == 3 and np.array_equal(cache.index_keys, kept)
