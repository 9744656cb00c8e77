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


# --------------------------------------------------------------------------- Hugging Face LlamaAttention


@pytest.mark.parametrize("H, Hkv", [(4, 2), (4, 1), (2, 2)])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_llama_attention_outputs_and_every_gradient(transformers, H, Hkv, bias, dtype):
    from mha_numpy.interop import llama

    module = llama.hf_llama_attention(4 * H, H, Hkv, rope_theta=300.0, bias=bias, dtype=dtype, seed=H + Hkv)
    x = np.random.default_rng(11).standard_normal((2, 6, 4 * H))
    report = llama.crosscheck_hf_llama_attention(module, x)
    assert report.passed, str(report)
    grads = [r.name for r in report.rows if r.name.startswith("dL/d")]
    assert len(grads) == 1 + (8 if bias else 4)  # the input and every parameter


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_llama_attention_with_a_head_dim_that_does_not_tile_the_hidden_size(transformers, dtype):
    """head_dim = 6 with hidden_size 16 and 4 heads (H·d = 24 != E): the module's head_dim option, every gradient."""
    from mha_numpy.interop import llama

    module = llama.hf_llama_attention(16, 4, 2, rope_theta=500.0, dtype=dtype, head_dim=6)
    mha = interop.from_hf_llama_attention(module)
    assert mha.head_dim == 6 and mha.params["W_q"].shape == (24, 16) and mha.params["W_o"].shape == (16, 24)
    report = llama.crosscheck_hf_llama_attention(module, np.random.default_rng(13).standard_normal((2, 5, 16)))
    assert report.passed, str(report)


def test_llama_attention_with_explicit_positions(transformers):
    from mha_numpy.interop import llama

    module = llama.hf_llama_attention(16, 4, 2, rope_theta=10000.0)
    x = np.random.default_rng(12).standard_normal((2, 5, 16))
    pos = np.array([[0, 1, 2, 3, 4], [100, 101, 102, 500, 501]])
    report = llama.crosscheck_hf_llama_attention(module, x, positions=pos)
    assert report.passed, str(report)


def test_llama_importer_shapes_and_refusals(transformers):
    from mha_numpy.interop import llama

    module = llama.hf_llama_attention(24, 6, 2, rope_theta=50.0, bias=False)
    mha = interop.from_hf_llama_attention(module)
    assert (mha.num_heads, mha.num_kv_heads, mha.rope_theta, mha.bias) == (6, 2, 50.0, False)
    assert mha.params["W_k"].shape == (8, 24)
    np.testing.assert_array_equal(mha.params["W_v"], module.v_proj.weight.detach().numpy())
    with pytest.raises(ValueError, match="LlamaAttention"):
        interop.from_hf_llama_attention(object())
    module.config.rope_parameters = {"rope_type": "linear", "rope_theta": 50.0, "factor": 2.0}
    with pytest.raises(ValueError, match="rope_type"):
        interop.from_hf_llama_attention(module)


def test_mask_from_hf_takes_the_bool_mask_transformers_hands_to_llamas_sdpa_attention(transformers, monkeypatch):
    """Reliability 5: transformers 5 gives its SDPA attention a bool (B, 1, Lq, Lk) mask, True = attend, causal and
    padding combined; mask_from_hf refused it (it took every 4-D mask for an additive one). Captured from a tiny
    LlamaModel with attn_implementation="sdpa", converted, and used with our kernel on the same q, k, v: the
    context is HF's on every query that sees a key (ours gives one that sees none, a left padding, zeros)."""
    import torch
    from transformers import LlamaConfig, LlamaModel
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from mha_numpy import kernels

    sdpa, seen = ALL_ATTENTION_FUNCTIONS["sdpa"], []

    def spy(module, query, key, value, attention_mask, *args, **kwargs):
        out = sdpa(module, query, key, value, attention_mask, *args, **kwargs)
        seen.append((query, key, value, attention_mask, kwargs["scaling"], out[0]))
        return out

    monkeypatch.setitem(ALL_ATTENTION_FUNCTIONS, "sdpa", spy)
    cfg = LlamaConfig(vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)  # fmt: skip
    torch.manual_seed(0)
    model = LlamaModel._from_config(cfg, attn_implementation="sdpa", dtype=torch.float64).eval()
    ids = torch.tensor([[3, 4, 5, 6, 7], [8, 9, 10, 11, 12]])
    am = np.array([[1, 1, 1, 1, 0], [0, 0, 1, 1, 1]])  # right and left padding
    with torch.no_grad():
        model(input_ids=ids, attention_mask=torch.from_numpy(am))
    q, k, v, hf_mask, scale, hf_out = (x.numpy() if torch.is_tensor(x) else x for x in seen[-1])
    assert hf_mask.dtype == np.bool_ and hf_mask.shape == (2, 1, 5, 5)  # what transformers 5 passes
    ours = interop.mask_from_hf(torch.from_numpy(hf_mask))
    want = masks.combine_masks(masks.padding_mask(attention_mask=am), masks.causal_mask(5))  # (2, 1, 5, 5)
    np.testing.assert_array_equal(ours, want)
    k, v = F.repeat_kv_forward(k, 2)[0], F.repeat_kv_forward(v, 2)[0]  # (B, H, L, d): HF's GQA grouping
    context, _ = kernels.VectorizedKernel().forward(q, k, v, mask=ours, scale=scale)  # (B, H, L, d)
    context = context.transpose(0, 2, 1, 3)  # (B, L, H, d), HF's layout
    sees = want[:, 0].any(-1)  # (B, L): queries with at least one key (all but the left padding here)
    assert sees.sum() == 8
    np.testing.assert_allclose(context[sees], hf_out[sees], rtol=1e-12, atol=1e-14)
    assert np.all(context[~sees] == 0)  # a query that sees no key: zero context (our convention)
    assert interop.mask_from_hf(None) is None


@pytest.mark.parametrize("prefill", [1, 4])
@pytest.mark.parametrize("H, Hkv", [(4, 2), (4, 1)])
def test_kv_cache_matches_hf_dynamic_cache_decoding(transformers, prefill, H, Hkv):
    from mha_numpy.interop import llama

    module = llama.hf_llama_attention(16, H, Hkv, rope_theta=1000.0)
    x = np.random.default_rng(13).standard_normal((2, 7, 16))
    report = llama.crosscheck_hf_llama_kv_cache(module, x, prefill=prefill)
    assert report.passed, str(report)


def test_llama_crosscheck_fails_on_a_wrong_rotation(transformers, monkeypatch):
    """The check can fail: a rotation by the wrong sign is caught."""
    from mha_numpy.interop import llama

    right = F.rotary_forward  # the one pair every RoPE step turns by

    def wrong(x, positions=None, *args, **kw):
        positions = -np.arange(x.shape[2]) if positions is None else -np.asarray(positions)
        return right(x, positions, *args, **kw)

    monkeypatch.setattr(F, "rotary_forward", wrong)
    module = llama.hf_llama_attention(16, 4, 2)
    x = np.random.default_rng(14).standard_normal((1, 4, 16))
    report = llama.crosscheck_hf_llama_attention(module, x)
    assert not report.passed and not report["output"].passed


# --------------------------------------------------------------------------- CLI


def test_cli_crosscheck_variants(transformers, capsys):
    from mha_numpy.__main__ import main

    assert main(["crosscheck", "--variants", "--heads", "4", "--embed-dim", "16", "--mask", "causal"]) == 0
    out = capsys.readouterr().out
    for title in ("enable_gqa=True (H=4, Hkv=2", "LlamaAttention (H=4, Hkv=2", "DynamicCache"):
        assert title in out
    assert "FAIL" not in out


@pytest.mark.parametrize(
    "argv, match",
    [
        (["--variants", "--heads", "4", "--embed-dim", "16", "--kv-heads", "3"], "--kv-heads: 3 does not divide"),
        (["--variants", "--heads", "4", "--embed-dim", "16", "--kv-heads", "0"], "--kv-heads"),
        (["--variants", "--heads", "2", "--embed-dim", "6"], "even head dim"),
        (["--variants", "--kdim", "5"], "--kdim"),
        (["--variants", "--rope-theta", "-1"], "--rope-theta"),
    ],
)
def test_cli_crosscheck_variants_usage_errors(argv, match, capsys):
    from mha_numpy.__main__ import main

    try:
        code = main(["crosscheck", *argv])
    except SystemExit as e:  # argparse refuses a bad single value while parsing
        code = e.code
    assert code == 2
    err = capsys.readouterr().err
    assert match in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
