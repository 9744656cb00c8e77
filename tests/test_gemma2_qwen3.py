"""Soft-capping against Gemma 2 and QK-norm against Qwen3 (``mha_numpy.interop.gemma2``, ``qwen3``).

Tiny random ``Gemma2Attention`` and ``Qwen3Attention`` built locally (nothing downloaded), eager attention, with
GQA (H = 4, Hkv = 2), RoPE, head_dim 6 != E / H = 4, Gemma 2's query_pre_attn_scalar 10 != head_dim, biases, a
batch of 2 with right padding, full and sliding layers (window 3 of 7 positions), on every kernel (the chunked
one with blocks of 2 and 2 threads, so the cap's 1 - tanh² is taken on recomputed scores inside its tiles).
Expected numbers always come from transformers and torch autograd; the float64 gradient checks from central
differences.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest
from helpers import grad_check_self_attention, require_torch

from mha_numpy import functional as F
from mha_numpy import interop, kernels, masks

KERNELS = {
    "vectorized": "vectorized",
    "naive": "naive",
    "chunked": kernels.get_kernel("chunked", block_size=2, num_threads=2),
    "auto": "auto",
}
LAYERS = {"full": None, "sliding": 3}
E, H, HKV, D, L, CAP, SCALAR = 16, 4, 2, 6, 7, 1.5, 10
PADDING = np.array([[1] * L, [1] * (L - 2) + [0] * 2])  # right padding: every query keeps a key


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


def build(model, window, dtype=np.float64, seed=0, bias=True, sizes=(E, H, HKV, D)):
    from mha_numpy.interop import gemma2, qwen3

    common = dict(head_dim=sizes[3], sliding_window=window, rope_theta=100.0, bias=bias, dtype=dtype, seed=seed)
    if model == "gemma2":
        return gemma2.hf_gemma2_attention(*sizes[:3], query_pre_attn_scalar=SCALAR, softcap=CAP, **common)
    return qwen3.hf_qwen3_attention(*sizes[:3], **common)


def check(model):
    return {"gemma2": interop.crosscheck_hf_gemma2_attention, "qwen3": interop.crosscheck_hf_qwen3_attention}[model]


def check_cache(model):
    return {"gemma2": interop.crosscheck_hf_gemma2_kv_cache, "qwen3": interop.crosscheck_hf_qwen3_kv_cache}[model]


def importer(model):
    return {"gemma2": interop.from_hf_gemma2_attention, "qwen3": interop.from_hf_qwen3_attention}[model]


def inputs(seed=1):
    return np.random.default_rng(seed).standard_normal((2, L, E))


# --------------------------------------------------------------------------- one call: every row, every kernel


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("kernel", list(KERNELS))
@pytest.mark.parametrize("layer", list(LAYERS))
@pytest.mark.parametrize("model", ["gemma2", "qwen3"])
def test_one_call_matches_transformers_on_every_kernel(transformers, model, layer, kernel, dtype):
    module = build(model, LAYERS[layer], dtype)
    report = check(model)(module, inputs(), attention_mask=PADDING, kernel=KERNELS[kernel])
    assert report.passed, str(report)
    assert report.rtol == (1e-10 if dtype == np.float64 else 1e-5)
    norms = ["q_norm", "k_norm"] if model == "qwen3" else []
    params = ["W_q", "W_k", "W_v", "W_o", "b_q", "b_k", "b_v", "b_o", *norms]
    expected = ["mask (allowed keys)", "output", "attention weights", "Q (as attended)", "K (as attended)",
                "V (as attended)", "dL/dx (q+k+v paths)", *(f"dL/d{p}" for p in params)]  # fmt: skip
    assert [r.name for r in report.rows] == expected
    assert not any(r.zero for r in report.rows[1:])  # every quantity is nonzero: no row passes by being 0
    assert report["mask (allowed keys)"].max_abs_err == 0  # ours and HF's masks agree exactly
    assert report["attention weights"].shape == (2, H, L, L) and report["K (as attended)"].shape == (2, HKV, L, D)


@pytest.mark.parametrize("layer", list(LAYERS))
def test_the_cap_is_reached_so_the_check_covers_its_flat_part(transformers, layer):
    """Gemma 2's scores here run well past the cap (tanh(s / cap) > 0.99), so 1 − tanh² is small and varies."""
    module = build("gemma2", LAYERS[layer])
    mha = interop.from_hf_gemma2_attention(module)
    x = inputs()
    mask = interop.decoder_attention.layer_mask(2, L, L, LAYERS[layer], PADDING)
    _, cache = mha.forward(x, x, x, mask=mask)
    capped = np.abs(cache.scores[np.broadcast_to(mask, cache.scores.shape)])  # the scores of allowed keys
    assert capped.max() < CAP and capped.max() > 0.99 * CAP and np.mean(capped > 0.9 * CAP) > 0.1


@pytest.mark.parametrize("kernel", ["vectorized", "chunked"])
@pytest.mark.parametrize("model", ["gemma2", "qwen3"])
def test_recompute_matches_transformers(transformers, model, kernel):
    report = check(model)(build(model, 3), inputs(2), attention_mask=PADDING, kernel=KERNELS[kernel], recompute=True)
    assert report.passed, str(report)


@pytest.mark.parametrize("model", ["gemma2", "qwen3"])
def test_explicit_positions_and_no_padding(transformers, model):
    pos = np.array([[0, 1, 2, 3, 4, 5, 6], [40, 41, 42, 43, 300, 301, 302]])
    report = check(model)(build(model, None, seed=3), inputs(3), positions=pos)
    assert report.passed, str(report)


@pytest.mark.parametrize("model", ["gemma2", "qwen3"])
def test_without_biases_every_parameter_is_still_compared(transformers, model):
    report = check(model)(build(model, 3, bias=False), inputs(4), attention_mask=PADDING, kernel=KERNELS["chunked"])
    assert report.passed, str(report)
    grads = [r.name for r in report.rows if r.name.startswith("dL/d")]
    assert len(grads) == 1 + 4 + (2 if model == "qwen3" else 0)


# --------------------------------------------------------------------------- decoding


@pytest.mark.parametrize("chunk", [1, 2])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("kernel", list(KERNELS))
@pytest.mark.parametrize("layer", list(LAYERS))
@pytest.mark.parametrize("model", ["gemma2", "qwen3"])
def test_decoding_matches_the_full_forward_and_transformers_cache(transformers, model, layer, kernel, dtype, chunk):
    """Prefill 3 tokens, then `chunk` a call (2: Lq = 2 != Lk); a sliding layer's DynamicCache keeps window - 1."""
    module = build(model, LAYERS[layer], dtype)
    report = check_cache(model)(module, inputs(5), attention_mask=PADDING, chunk=chunk, kernel=KERNELS[kernel])
    assert report.passed, str(report)
    expected = ["masks, every call", "outputs, every call", "cached ≡ full forward", "cached keys (as attended)",
                "cached values"]  # fmt: skip
    assert [r.name for r in report.rows] == expected
    kept = L if layer == "full" else LAYERS[layer] - 1
    assert report["cached keys (as attended)"].shape == (2, HKV, kept, D)


# --------------------------------------------------------------------------- finite differences


@pytest.mark.parametrize("model", ["gemma2", "qwen3"])
def test_the_imported_module_passes_finite_differences_under_a_sliding_padded_mask(transformers, model):
    """A smaller module (E = 8, H = 2, Hkv = 1, head_dim 6): central differences cost two calls a parameter entry."""
    mha = importer(model)(build(model, 2, sizes=(8, 2, 1, 6)))
    mha.kernel = kernels.get_kernel("chunked", block_size=2)
    x = np.random.default_rng(6).standard_normal((2, 5, 8))
    mask = interop.decoder_attention.layer_mask(2, 5, 5, 2, [[1] * 5, [1, 1, 1, 1, 0]])
    grad_check_self_attention(mha, x, mask)


# --------------------------------------------------------------------------- the checks can fail


def test_gemma2_check_fails_without_the_cap(transformers, monkeypatch):
    monkeypatch.setattr(F, "soft_cap_forward", lambda s, cap: (s, np.zeros_like(s)))  # identity, derivative 1
    assert not interop.crosscheck_hf_gemma2_attention(build("gemma2", None), inputs()).passed


def test_gemma2_gradient_rows_see_the_caps_derivative_in_the_chunked_tiles(transformers, monkeypatch):
    monkeypatch.setattr(F, "soft_cap_backward", lambda d_out, t: d_out)  # 1 instead of 1 - tanh²
    report = interop.crosscheck_hf_gemma2_attention(build("gemma2", 3), inputs(), kernel=KERNELS["chunked"])
    assert report["output"].passed and report["attention weights"].passed
    assert not any(report[f"dL/d{n}"].passed for n in ("W_q", "W_k", "b_q", "b_k"))  # behind the scores
    assert all(report[f"dL/d{n}"].passed for n in ("W_v", "W_o", "b_v", "b_o"))  # not behind them


def test_gemma2_check_fails_with_the_default_scale(transformers, monkeypatch):
    from mha_numpy.interop import gemma2

    right = gemma2.from_hf_gemma2_attention

    def default_scale(module):
        mha = right(module)
        mha.scale = None  # 1/sqrt(head_dim) instead of query_pre_attn_scalar^-1/2
        return mha

    monkeypatch.setattr(gemma2, "from_hf_gemma2_attention", default_scale)
    report = interop.crosscheck_hf_gemma2_attention(build("gemma2", None), inputs())
    assert not report["output"].passed and report["Q (as attended)"].passed


def test_qwen3_check_fails_with_swapped_norm_weights(transformers, monkeypatch):
    from mha_numpy.interop import qwen3

    right = qwen3.from_hf_qwen3_attention

    def swapped(module):
        mha = right(module)
        mha.params["q_norm"], mha.params["k_norm"] = mha.params["k_norm"], mha.params["q_norm"]
        return mha

    monkeypatch.setattr(qwen3, "from_hf_qwen3_attention", swapped)
    report = interop.crosscheck_hf_qwen3_attention(build("qwen3", None), inputs())
    assert not report["Q (as attended)"].passed and not report["K (as attended)"].passed


@pytest.mark.parametrize("model", ["gemma2", "qwen3"])
def test_a_window_one_wider_than_hf_is_caught(transformers, model, monkeypatch):
    right = masks.sliding_window_mask
    monkeypatch.setattr(masks, "sliding_window_mask", lambda Lq, Lk, w, **kw: right(Lq, Lk, w + 1, **kw))
    report = check(model)(build(model, 3), inputs())
    assert not report["mask (allowed keys)"].passed and not report["output"].passed


@pytest.mark.parametrize("model", ["gemma2", "qwen3"])
def test_float64_needs_hf_float32_steps_switched_off_and_they_are_restored(transformers, torch, model, monkeypatch):
    """As shipped, HF's eager softmax (and Qwen3RMSNorm) round through float32: ~1e-7 from ours, far above 1e-10.
    The contexts that switch them off put everything back."""
    from contextlib import nullcontext

    from mha_numpy.interop import decoder_attention as DA

    module = build(model, 3)
    modeling = sys.modules[type(module).__module__]
    eager, softmax = modeling.eager_attention_forward, torch.nn.functional.softmax
    assert check(model)(module, inputs(), attention_mask=PADDING).passed
    assert modeling.eager_attention_forward is eager and torch.nn.functional.softmax is softmax
    if model == "qwen3":
        assert "forward" not in vars(module.q_norm) and "forward" not in vars(module.k_norm)
    with monkeypatch.context() as m:  # the float64 steps switched off: HF as shipped
        m.setattr(DA, "softmax_in_input_dtype", lambda torch: nullcontext())
        if model == "qwen3":
            from mha_numpy.interop import qwen3

            m.setattr(qwen3, "rms_norm_in_float64", nullcontext)
        shipped = check(model)(module, inputs(), attention_mask=PADDING)
    assert not shipped["attention weights"].passed  # the float32 softmax
    assert shipped["Q (as attended)"].passed == (model == "gemma2")  # Qwen3RMSNorm's float32 round trip
    worst = max(r.max_rel_err for r in shipped.rows)
    assert 1e-9 < worst < 1e-5, str(shipped)  # float32 rounding, nothing else


# --------------------------------------------------------------------------- the importers


def test_gemma2_importer_reads_scale_softcap_and_head_dim(transformers):
    module = build("gemma2", 3)
    mha = interop.from_hf_gemma2_attention(module)
    assert (mha.num_heads, mha.num_kv_heads, mha.head_dim, mha.softcap, mha.rope_theta) == (H, HKV, D, CAP, 100.0)
    assert mha.scale == SCALAR**-0.5 and mha.params["W_q"].shape == (H * D, E) and mha.params["W_o"].shape == (E, H * D)
    np.testing.assert_array_equal(mha.params["W_k"], module.k_proj.weight.detach().numpy())
    from mha_numpy.interop import gemma2

    uncapped = interop.from_hf_gemma2_attention(gemma2.hf_gemma2_attention(E, H, HKV, softcap=None))
    assert uncapped.softcap is None and uncapped.head_dim == E // H and uncapped.scale == (E // H) ** -0.5
    with pytest.raises(ValueError, match="Gemma2Attention"):
        interop.from_hf_gemma2_attention(object())
    module.config.rope_parameters = {"rope_type": "linear", "rope_theta": 100.0, "factor": 2.0}
    with pytest.raises(ValueError, match="rope_type"):
        interop.from_hf_gemma2_attention(module)


def test_qwen3_importer_reads_the_norms(transformers):
    from mha_numpy.interop import qwen3

    module = qwen3.hf_qwen3_attention(E, H, HKV, head_dim=D, rms_norm_eps=1e-5)
    mha = interop.from_hf_qwen3_attention(module)
    assert mha.qk_norm and mha.qk_norm_eps == 1e-5 and mha.head_dim == D and mha.scale is None
    assert mha.params["q_norm"].shape == (D,) and not mha.bias
    np.testing.assert_array_equal(mha.params["k_norm"], module.k_norm.weight.detach().numpy())
    with pytest.raises(ValueError, match="Qwen3Attention"):
        interop.from_hf_qwen3_attention(object())


@pytest.mark.parametrize("model", ["gemma2", "qwen3"])
def test_the_checks_refuse_what_they_cannot_compare(transformers, model):
    module = build(model, 3)
    left = np.array([[1] * L, [0, 0] + [1] * (L - 2)])  # a left-padded query sees only padding
    with pytest.raises(ValueError, match="attention_mask leaves query 0 of batch item 1 no key"):
        check(model)(module, inputs(), attention_mask=left)
    with pytest.raises(ValueError, match="hidden_states must be float"):
        check(model)(module, inputs()[..., :-1])
    with pytest.raises(ValueError, match="chunk must be a positive int"):
        check_cache(model)(module, inputs(), chunk=0)
    module.config._attn_implementation = "sdpa"
    with pytest.raises(ValueError, match="eager attention"):
        check(model)(module, inputs())


def test_olmo2_normalises_the_whole_projection_so_only_qwen3s_form_is_imported(transformers):
    """OLMo 2's QK-norm is one RMSNorm over q_proj(x) (H·d features) and k_proj(x) (Hkv·d), before the head split:
    not Qwen3's per-head norm over d, which is what qk_norm=True builds; the Qwen3 importer refuses it."""
    import torch
    from transformers import Olmo2Config
    from transformers.models.olmo2.modeling_olmo2 import Olmo2Attention

    cfg = Olmo2Config(hidden_size=E, num_attention_heads=H, num_key_value_heads=HKV, num_hidden_layers=1,
                      intermediate_size=2 * E, vocab_size=16, attn_implementation="eager")  # fmt: skip
    module = Olmo2Attention(cfg, layer_idx=0).to(torch.float64)
    d = E // H
    assert module.q_norm.weight.shape == (H * d,) and module.k_norm.weight.shape == (HKV * d,)
    with pytest.raises(ValueError, match=r"q_norm, k_norm must be per head, \(4,\); got \(16,\)"):
        interop.from_hf_qwen3_attention(module)
