"""Today's variants against torch and Hugging Face: GQA vs SDPA ``enable_gqa``, RoPE vs ``apply_rotary_pos_emb``,
ALiBi vs BLOOM, and (through ``mha_numpy.interop.llama``) the module against ``LlamaAttention`` and its cache.

Expected numbers always come from torch / transformers.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import require_torch

from mha_numpy import functional as F
from mha_numpy import interop, masks


@pytest.fixture
def torch():
    t = require_torch()
    t.set_num_threads(1)
    return t


@pytest.fixture
def transformers(torch):
    return pytest.importorskip(
        "transformers", reason="transformers is not installed: pip install -r requirements-dev.txt"
    )


@pytest.mark.parametrize("H, Hkv", [(4, 2), (4, 1), (6, 3), (3, 3)])
@pytest.mark.parametrize("mask_kind", ["none", "causal", "float"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_gqa_matches_torch_sdpa_enable_gqa(torch, H, Hkv, mask_kind, dtype):
    rng = np.random.default_rng(H * 10 + Hkv)
    B, Lq, Lk, d = 2, 4, 5, 3
    q = rng.standard_normal((B, H, Lq, d)).astype(dtype)
    k = rng.standard_normal((B, Hkv, Lk, d)).astype(dtype)
    v = rng.standard_normal((B, Hkv, Lk, d + 1)).astype(dtype)
    mask = {
        "none": None,
        "causal": masks.causal_mask(Lq, Lk),
        "float": rng.standard_normal((1, H, Lq, Lk)).astype(dtype),
    }[mask_kind]
    report = interop.crosscheck_gqa_sdpa(q, k, v, attn_mask=mask)
    assert report.passed, str(report)
    assert report["dL/dk"].shape == (B, Hkv, Lk, d)


def test_gqa_crosscheck_fails_on_a_wrong_grouping(torch, monkeypatch):
    """The check can fail: interleaved heads (h % Hkv instead of h // n_rep) are caught."""
    right = F.repeat_kv_forward

    def interleaved(x, n_rep):
        out, cache = right(x, n_rep)
        return np.tile(x, (1, n_rep, 1, 1)), cache

    monkeypatch.setattr(F, "repeat_kv_forward", interleaved)
    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((1, 4, 3, 2)), rng.standard_normal((1, 2, 3, 2)), rng.standard_normal((1, 2, 3, 2))
    assert not interop.crosscheck_gqa_sdpa(q, k, v).passed


@pytest.mark.parametrize("positions", ["default", "2d"])
def test_rope_matches_hf_apply_rotary_pos_emb(torch, transformers, positions):
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    rng = np.random.default_rng(9)
    B, H, L, d, theta = 2, 3, 6, 8, 10000.0
    x = rng.standard_normal((B, H, L, d))
    pos = np.broadcast_to(np.arange(L), (B, L)) if positions == "default" else rng.integers(0, 4096, (B, L))
    ours, cache = F.rope_forward(x, None if positions == "default" else pos, theta)
    # HF's cos/sin formula (LlamaRotaryEmbedding) with torch ops in float64
    inv_freq = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    emb = torch.from_numpy(np.asarray(pos, dtype=np.float64))[..., None] * inv_freq
    emb = torch.cat((emb, emb), dim=-1)
    tx = torch.from_numpy(x).requires_grad_()
    theirs, _ = apply_rotary_pos_emb(tx, tx, emb.cos(), emb.sin())
    np.testing.assert_allclose(ours, theirs.detach().numpy(), rtol=0, atol=1e-12)
    d_out = rng.standard_normal(x.shape)
    (g,) = torch.autograd.grad(theirs, tx, torch.from_numpy(d_out))
    np.testing.assert_allclose(F.rope_backward(d_out, cache), g.numpy(), rtol=0, atol=1e-12)


@pytest.mark.parametrize("H", [1, 2, 5, 8, 12, 20])
def test_alibi_slopes_match_bloom(torch, transformers, H):
    from transformers.models.bloom.modeling_bloom import _get_alibi_slopes

    theirs = _get_alibi_slopes(H, torch.device("cpu")).numpy()  # float32
    np.testing.assert_allclose(F.alibi_slopes(H), theirs, rtol=1e-6, atol=0)  # a few float32 ulp (torch.pow)


def test_alibi_weights_match_bloom_build_alibi_tensor_under_a_causal_mask(torch, transformers):
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    rng = np.random.default_rng(10)
    B, H, L, d = 2, 4, 6, 5
    q, k, v = (rng.standard_normal((B, H, L, d)) for _ in range(3))
    alibi = build_alibi_tensor(torch.ones(B, L, dtype=torch.int64), H, torch.float64).numpy().reshape(B, H, 1, L)
    causal = masks.causal_mask(L)
    _, theirs = F.scaled_dot_product_attention_forward(q, k, v, masks.combine_masks(causal, alibi))
    _, ours = F.scaled_dot_product_attention_forward(q, k, v, masks.combine_masks(causal, F.alibi_bias(H, L)))
    # BLOOM's slopes are float32: the weights agree to float32 rounding of the slopes
    np.testing.assert_allclose(ours.attn_weights, theirs.attn_weights, rtol=0, atol=1e-6)
