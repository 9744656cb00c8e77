"""The Llama-style decoder built from the generic block (models.decoder): finite differences, token-by-token
decoding with a KVCache per layer, and a two-layer tiny random transformers LlamaModel (GQA, RoPE, RMSNorm, SwiGLU)
in float64 and float32: every layer's hidden state and every parameter gradient against torch autograd. The
expected numbers come from transformers, never from mha_numpy."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import require_torch

from mha_numpy import KVCache
from mha_numpy.gradcheck import GradcheckReport, numerical_gradient
from mha_numpy.models.decoder import LLAMA_NAMES, DecoderConfig, DecoderModel, param_shapes

CONFIG = DecoderConfig(vocab_size=11, hidden_size=8, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, intermediate_size=12, rms_norm_eps=1e-6, rope_theta=100.0)  # fmt: skip


def inputs(B=3, L=6, V=11, seed=1, pad="right"):
    """ids (B, L) with a repeated id, and HF's attention_mask (1 = keep) with padding in rows 1 and 2: "right",
    "left" (the first queries of those rows see no key at all: fully masked rows) or None."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, V, (B, L))
    ids[0, 1] = ids[0, 4]
    mask = np.ones((B, L), np.int64)
    if pad == "right":
        mask[1, L - 2 :], mask[2, 2:] = 0, 0
    elif pad == "left":
        mask[1, :2], mask[2, :4] = 0, 0
    return ids, mask


@pytest.fixture
def transformers():
    torch = require_torch()
    torch.set_num_threads(1)
    return pytest.importorskip(
        "transformers", reason="transformers is not installed: pip install -r requirements-dev.txt"
    )


# --------------------------------------------------------------------------- NumPy alone


@pytest.mark.parametrize("pad", ["right", "left"])
def test_every_parameter_passes_finite_differences_with_padding(pad):
    model = DecoderModel.random(CONFIG, rng=0, std=0.4)
    ids, mask = inputs(pad=pad)
    out, cache = model.forward(ids, mask)
    d = np.random.default_rng(2).standard_normal(out.last_hidden_state.shape)
    grads = model.backward(d, cache)
    assert list(grads) == list(model.params) == list(param_shapes(CONFIG))
    report = GradcheckReport(atol=5e-8, rtol=1e-6)  # atol: as test_bert_backward (a sum over 144 outputs)
    for name, p in model.params.items():
        report.add(
            name, grads[name], numerical_gradient(lambda _p: model.forward(ids, mask)[0].last_hidden_state, p, d)
        )
    assert report.passed, str(report)
    assert max(r.max_rel_err for r in report.rows) <= 1e-7, str(report)
    assert max(max(abs(r.numerical), abs(r.analytic)) for r in report.rows) > 0.1  # the scale atol is judged against


def test_decoding_token_by_token_with_a_kv_cache_per_layer_equals_the_causal_forward():
    model = DecoderModel.random(CONFIG, rng=3, std=0.4)
    ids, _ = inputs(B=2, L=7, pad=None)
    full = model(ids)
    kvs = [KVCache() for _ in model.layers]
    steps = [model(ids[:, :3], kv_caches=kvs)] + [model(ids[:, t : t + 1], kv_caches=kvs) for t in range(3, 7)]
    assert [len(kv) for kv in kvs] == [7, 7]
    scale = np.abs(full.last_hidden_state).max()
    for i in range(len(full.hidden_states)):  # every layer, not only the last
        got = np.concatenate([s.hidden_states[i] for s in steps], axis=1)
        np.testing.assert_allclose(got, full.hidden_states[i], rtol=0, atol=1e-13 * scale)
    np.testing.assert_allclose(np.concatenate([s.last_hidden_state for s in steps], axis=1), full.last_hidden_state,
                               rtol=0, atol=1e-13 * scale)  # fmt: skip
    assert steps[-1].attentions[0].shape == (2, 4, 1, 7)  # one query, every cached key


def test_decoding_with_padding_attends_to_the_real_tokens_only():
    """A left-padded prompt decoded with its attention_mask (cached + new positions) equals the same prompt without
    padding at shifted positions: the padded keys carry no weight and RoPE sees only position differences."""
    model = DecoderModel.random(CONFIG, rng=4, std=0.4)
    ids, _ = inputs(B=1, L=5, pad=None)
    plain = model(ids).last_hidden_state
    padded = np.concatenate([np.zeros((1, 2), np.int64), ids], axis=1)
    keep = np.array([[0, 0, 1, 1, 1, 1, 1]])
    kvs = [KVCache() for _ in model.layers]
    first = model(padded[:, :4], keep[:, :4], kv_caches=kvs).last_hidden_state
    rest = [model(padded[:, t : t + 1], keep[:, : t + 1], kv_caches=kvs).last_hidden_state for t in range(4, 7)]
    got = np.concatenate([first[:, 2:], *rest], axis=1)
    np.testing.assert_allclose(got, plain, rtol=0, atol=1e-13 * np.abs(plain).max())


def test_the_padding_row_of_embed_tokens_is_frozen():
    config = DecoderConfig(**{**CONFIG.__dict__, "pad_token_id": 0})
    model = DecoderModel.random(config, rng=5, std=0.4)
    ids, mask = inputs()
    ids[1, -2:] = 0
    out, cache = model.forward(ids, mask)
    g = model.backward(np.ones_like(out.last_hidden_state), cache)["embed_tokens.weight"]
    assert not g[0].any() and np.abs(g[1:]).max() > 0


def test_bad_input_raises_naming_the_argument():
    model = DecoderModel.random(CONFIG)
    ids, mask = inputs()
    cases = [
        (lambda: model.forward(ids + 11), "input_ids"),
        (lambda: model.forward(ids.astype(float)), "input_ids"),
        (lambda: model.forward(ids, mask[:, :3]), "attention_mask"),
        (lambda: model.forward(ids, kv_caches=[KVCache()]), "kv_caches"),
        (lambda: model.forward(ids, positions=np.arange(3)), "positions"),
        (lambda: DecoderModel(CONFIG, {}), "lack"),
        (lambda: DecoderModel(CONFIG, {**model.params, "norm.weight": np.ones(3)}), "norm.weight"),
        (lambda: DecoderModel(CONFIG, model.params, dtype=np.int64), "dtype"),
    ]
    for call, match in cases:
        with pytest.raises(ValueError, match=match):
            call()
    out, cache = model.forward(ids)
    with pytest.raises(ValueError, match="cache"):
        DecoderModel.random(CONFIG).backward(out.last_hidden_state, cache)
    with pytest.raises(ValueError, match="d_last_hidden_state"):
        model.backward(out.last_hidden_state[:, :2], cache)
    kvs = [KVCache() for _ in model.layers]
    with pytest.raises(ValueError, match="kv_cache"):
        model.backward(out.last_hidden_state, model.forward(ids, kv_caches=kvs)[1])


def test_weights_are_copied_and_float32_stays_float32():
    model = DecoderModel.random(CONFIG)
    m32 = DecoderModel(CONFIG, model.params, dtype=np.float32)
    assert all(p.dtype == np.float32 for p in m32.params.values())
    assert m32.params["norm.weight"] is not model.params["norm.weight"]
    ids, _ = inputs()
    out, cache = m32.forward(ids)
    assert out.last_hidden_state.dtype == np.float32
    assert all(g.dtype == np.float32 for g in m32.backward(np.ones_like(out.last_hidden_state), cache).values())
    assert m32.layers[0].attention.params["W_q"] is m32.params["layers.0." + LLAMA_NAMES["W_q"]]


# --------------------------------------------------------------------------- against transformers.LlamaModel


@pytest.mark.parametrize("pad", [None, "right", "left"])
def test_two_layer_llama_matches_transformers_in_float64(transformers, pad):
    """Every layer's hidden state and every parameter gradient to 1e-10 relative to the largest entry.

    HF's float32 steps (RMSNorm, RoPE angles, eager softmax) run in float64 here (``float64_throughout``);
    the report's note gives the distance to the model as shipped (~1e-7)."""
    from mha_numpy.interop.llama_model import crosscheck_hf_llama_model, hf_llama_model

    hf = hf_llama_model(dtype=np.float64)
    ids, mask = inputs(V=32, pad=pad)
    report = crosscheck_hf_llama_model(hf, ids, None if pad is None else mask, rng=0)
    assert report.passed, str(report)
    assert report.rtol == 1e-10
    names = [r.name for r in report.rows]
    assert names[:4] == ["embeddings", "layer 0 output", "layer 1 output", "last_hidden_state"]
    assert sorted(names[4:]) == sorted(f"d {n}" for n, _ in hf.named_parameters())
    assert max(r.max_rel_err for r in report.rows) <= 1e-12, str(report)
    assert not any(r.zero for r in report.rows)  # every gradient is nonzero: each row is a real comparison
    assert "as shipped" in report.notes[-1]


def test_two_layer_llama_matches_transformers_in_float32_as_shipped(transformers):
    from mha_numpy.interop.llama_model import crosscheck_hf_llama_model, hf_llama_model

    hf = hf_llama_model(dtype=np.float32, attn_implementation="eager")
    ids, mask = inputs(V=32)
    report = crosscheck_hf_llama_model(hf, ids, mask, rng=0)
    assert report.rtol == 1e-5 and report.passed, str(report)
    assert hf.config._attn_implementation == "eager"


def test_the_crosscheck_can_fail_and_leaves_the_model_as_it_was(transformers, monkeypatch):
    """A wrong SwiGLU (up and gate swapped) is caught; the HF model's forward methods and attention come back."""
    import torch

    from mha_numpy.interop.llama_model import crosscheck_hf_llama_model, hf_llama_model
    from mha_numpy.models import layers as LY

    hf = hf_llama_model(dtype=np.float64)
    ids, mask = inputs(V=32)
    with torch.no_grad():
        before = hf(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask)).last_hidden_state.numpy()
    right = LY.swiglu_forward
    monkeypatch.setattr(LY, "swiglu_forward", lambda x, g, u, d: right(x, u, g, d))
    report = crosscheck_hf_llama_model(hf, ids, mask)
    assert not report.passed and not report["last_hidden_state"].passed
    assert hf.config._attn_implementation == "eager"
    assert all("forward" not in vars(m) for m in hf.modules())
    with torch.no_grad():
        after = hf(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask)).last_hidden_state.numpy()
    np.testing.assert_array_equal(after, before)


def test_import_from_a_state_dict_and_refusals(transformers):
    from mha_numpy.interop.llama_model import decoder_config_from_hf, from_hf_llama_state_dict, hf_llama_model

    hf = hf_llama_model(dtype=np.float64)
    ours = from_hf_llama_state_dict({"model." + k: v for k, v in hf.state_dict().items()}, hf.config)
    assert list(ours.params) == [n for n, _ in hf.named_parameters()]
    for name, p in hf.named_parameters():
        np.testing.assert_array_equal(ours.params[name], p.detach().numpy())
    assert ours.config.rope_theta == 10000.0 and ours.config.num_key_value_heads == 2
    for change, match in [({"attention_bias": True}, "attention_bias"), ({"mlp_bias": True}, "mlp_bias"),
                          ({"hidden_act": "gelu"}, "hidden_act"), ({"head_dim": 8}, "head_dim")]:  # fmt: skip
        config = transformers.LlamaConfig(**{**hf.config.to_dict(), **change})
        with pytest.raises(ValueError, match=match):
            decoder_config_from_hf(config)
