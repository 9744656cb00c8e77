"""BertModel.backward: finite differences on a tiny random BERT (post- and pre-norm, eval and training with fixed
dropout masks), torch autograd on the real all-MiniLM-L6-v2 (float64 and float32), dropout reproducibility and
bad input. The torch side is transformers' own BertModel, never numbers produced by mha_numpy."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from helpers import require_torch

from mha_numpy import bert
from mha_numpy.bert import BertModel
from mha_numpy.gradcheck import GradcheckReport, numerical_gradient

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

SENTENCES = [
    "The cat sat on the mat because it was tired.",
    "Hi.",
    "Paris is the capital of France; Berlin is the capital of Germany.",
    "She gave him the book that he had asked for.",
]


def tiny_bert(norm: str = "post", seed: int = 0, dropout: float = 0.1, hidden_act: str = "gelu") -> BertModel:
    """2 layers, 2 heads, E = 8, I = 12, float64, random weights (biases and LayerNorms too)."""
    config = bert.BertConfig(
        vocab_size=20, hidden_size=8, num_hidden_layers=2, num_attention_heads=2, intermediate_size=12,
        max_position_embeddings=10, type_vocab_size=2, layer_norm_eps=1e-6, hidden_act=hidden_act,
        hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout,
    )  # fmt: skip
    rng = np.random.default_rng(seed)
    weights = {name: rng.normal(0, 0.5, shape) for name, shape in bert.expected_shapes(config).items()}
    for name in weights:
        if name.endswith("LayerNorm.weight"):
            weights[name] += 1.0
    return BertModel(config, weights, dtype=np.float64, norm=norm)


def tiny_inputs(seed: int = 1):
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, 20, (2, 6))
    ids[0, 1] = ids[0, 3]  # a repeated id
    mask = np.ones((2, 6), np.int64)
    mask[1, 4:] = 0
    ids[1, 4:] = 0  # [PAD]
    types = (np.arange(6) >= 3).astype(np.int64)[None].repeat(2, 0)
    return ids, mask, types


def finite_difference_report(model: BertModel, training: bool) -> GradcheckReport:
    ids, mask, types = tiny_inputs()
    masks = model.sample_dropout_masks(2, 6, rng=7) if training else None
    out, cache = model.forward(ids, mask, types, training=training, dropout_masks=masks)
    d = np.random.default_rng(3).standard_normal(out.last_hidden_state.shape)
    grads = model.backward(d, cache)

    def f(_):
        return model.forward(ids, mask, types, training=training, dropout_masks=masks)[0].last_hidden_state

    # atol: central differences of a sum over 96 outputs of size ~1 carry ~1e-16 * 100 / eps = 1e-8 of rounding;
    # the largest gradients are ~1-10, so 5e-8 is still ~1e-8 relative to the largest (b_k: exactly 0 in theory)
    report = GradcheckReport(atol=5e-8, rtol=1e-6)
    for name, p in model.params.items():
        numerical = numerical_gradient(f, p, d, eps=1e-6)
        if name == "embeddings.word_embeddings.weight":  # torch's padding_idx: the [PAD] row is frozen on purpose
            pad = model.config.pad_token_id
            assert np.all(grads[name][pad] == 0) and np.abs(numerical[pad]).max() > 1e-3
            numerical[pad] = 0.0
        report.add(name, grads[name], numerical)
    return report


@pytest.mark.parametrize("norm", ["post", "pre"])
@pytest.mark.parametrize("training", [False, True])
def test_tiny_bert_every_parameter_passes_finite_differences(norm, training):
    model = tiny_bert(norm)
    report = finite_difference_report(model, training)
    assert len(report.rows) == len(model.params) == 5 + 2 * 16
    assert report.passed, str(report)
    assert max(r.max_rel_err for r in report.rows) <= 1e-7, str(report)
    assert max(max(abs(r.numerical), abs(r.analytic)) for r in report.rows) > 0.1  # the scale atol is judged against


def test_pre_norm_and_post_norm_are_different_models_with_the_same_names():
    ids, mask, types = tiny_inputs()
    post, pre = tiny_bert("post"), tiny_bert("pre")
    assert list(post.params) == list(pre.params)
    y_post, c_post = post.forward(ids, mask, types)
    y_pre, c_pre = pre.forward(ids, mask, types)
    assert not np.allclose(y_post.last_hidden_state, y_pre.last_hidden_state)
    # with both sublayers switched off (output projections 0), a pre-norm block is the identity, so the gradient
    # reaches the embeddings unchanged; a post-norm block still applies two LayerNorms
    for model in (post, pre):
        for name, p in model.params.items():
            if ".output.dense." in name or ".attention.output.dense." in name:
                p[...] = 0.0
    d = np.random.default_rng(0).standard_normal(y_post.last_hidden_state.shape)
    y_pre, c_pre = pre.forward(ids, mask, types)
    np.testing.assert_array_equal(y_pre.last_hidden_state, y_pre.hidden_states[0])
    g_pre = pre.backward(d, c_pre, return_hidden_grads=True)
    h_pre = [g for name, g in g_pre.items() if name.startswith("hidden_states.")]
    assert len(h_pre) == 3 and all(np.array_equal(g, d) for g in h_pre)
    y_post, c_post = post.forward(ids, mask, types)
    h_post = [g for n, g in post.backward(d, c_post, return_hidden_grads=True).items() if n.startswith("hidden_s")]
    assert not np.allclose(h_post[0], d)
    with pytest.raises(ValueError, match="norm"):
        BertModel(post.config, post.params, dtype=np.float64, norm="sandwich")


# --------------------------------------------------------------------------- dropout


def test_dropout_is_reproducible_by_seed_and_replayable_by_masks():
    model = tiny_bert()
    ids, mask, types = tiny_inputs()
    a, ca = model.forward(ids, mask, types, training=True, rng=5)
    b, _ = model.forward(ids, mask, types, training=True, rng=5)
    c, _ = model.forward(ids, mask, types, training=True, rng=6)
    e, _ = model.forward(ids, mask, types)
    np.testing.assert_array_equal(a.last_hidden_state, b.last_hidden_state)
    assert not np.allclose(a.last_hidden_state, c.last_hidden_state)
    assert not np.allclose(a.last_hidden_state, e.last_hidden_state)
    r, _ = model.forward(ids, mask, types, training=True, dropout_masks=ca.dropout_masks)
    np.testing.assert_array_equal(a.last_hidden_state, r.last_hidden_state)
    assert set(ca.dropout_masks) == set(model.sample_dropout_masks(2, 6, 0))
    keep_all = {n: np.ones_like(m) for n, m in ca.dropout_masks.items()}
    full, _ = model.forward(ids, mask, types, training=True, dropout_masks=keep_all)
    # keeping everything only rescales by 1/(1-p): not the eval output, but the same with p = 0
    no_drop = tiny_bert(dropout=0.0)
    z, _ = no_drop.forward(ids, mask, types, training=True, dropout_masks=keep_all)
    np.testing.assert_allclose(z.last_hidden_state, e.last_hidden_state, rtol=1e-13, atol=1e-13)
    assert not np.allclose(full.last_hidden_state, e.last_hidden_state)


def test_dropout_masks_are_checked():
    model = tiny_bert()
    ids, mask, types = tiny_inputs()
    masks = model.sample_dropout_masks(2, 6, 0)
    with pytest.raises(ValueError, match="only used with training=True"):
        model.forward(ids, mask, types, dropout_masks=masks)
    bad = dict(masks, embeddings=masks["embeddings"][:, :3])
    with pytest.raises(ValueError, match=r"dropout_masks\['embeddings'\]"):
        model.forward(ids, mask, types, training=True, dropout_masks=bad)
    with pytest.raises(ValueError, match="keys"):
        model.forward(ids, mask, types, training=True, dropout_masks={"embeddings": masks["embeddings"]})


# --------------------------------------------------------------------------- bad input


def test_backward_refuses_a_foreign_cache_and_a_wrong_gradient():
    model, other = tiny_bert(), tiny_bert()
    ids, mask, types = tiny_inputs()
    out, cache = model.forward(ids, mask, types)
    _, other_cache = other.forward(ids, mask, types)
    d = np.ones_like(out.last_hidden_state)
    with pytest.raises(ValueError, match="cache"):
        model.backward(d, other_cache)
    with pytest.raises(ValueError, match="cache"):
        model.backward(d, {"not": "a cache"})
    with pytest.raises(ValueError, match=r"d_last_hidden_state.*\(2, 6, 8\).*\(2, 5, 8\)"):
        model.backward(d[:, :5], cache)
    with pytest.raises(ValueError, match="d_last_hidden_state.*float32"):
        model.backward(d.astype(np.float32), cache)


def test_params_are_copies_and_the_forward_reads_them():
    model = tiny_bert()
    ids, mask, types = tiny_inputs()
    name = "encoder.layer.1.attention.self.value.weight"
    before = model(ids, mask, types).last_hidden_state
    model.params[name] = model.params[name] * 0.5  # replaced, not updated in place
    assert not np.allclose(model(ids, mask, types).last_hidden_state, before)
    model.params[name] *= 2.0  # updated in place
    np.testing.assert_allclose(model(ids, mask, types).last_hidden_state, before, rtol=1e-14)
    weights = {n: p.copy() for n, p in model.params.items()}
    copy = BertModel(model.config, weights, dtype=np.float64)
    copy.params[name] += 1.0
    assert not np.shares_memory(copy.params[name], weights[name])


def test_real_model_params_have_checkpoint_names_shapes_and_dtype():
    model = BertModel.from_pretrained(dtype=np.float32)
    assert len(model.params) == 101 and all(p.dtype == np.float32 for p in model.params.values())
    assert model.params["encoder.layer.0.attention.self.query.weight"].shape == (384, 384)
    assert model.params["encoder.layer.5.intermediate.dense.weight"].shape == (1536, 384)
    assert model.layers[0].attention.params["W_q"] is model.params["encoder.layer.0.attention.self.query.weight"]
    inputs = model.tokenize(SENTENCES[:2])
    out, cache = model.forward(inputs.input_ids, inputs.attention_mask, inputs.token_type_ids, training=True, rng=0)
    grads = model.backward(np.ones_like(out.last_hidden_state), cache)  # float32 stays float32, every tensor
    assert list(grads) == list(model.params)
    assert all(grads[n].dtype == np.float32 and grads[n].shape == p.shape for n, p in model.params.items())


# --------------------------------------------------------------------------- against torch autograd


@pytest.mark.parametrize("dtype, rtol", [(np.float64, 1e-9), (np.float32, 1e-4)])
def test_real_minilm_every_gradient_matches_torch_autograd(dtype, rtol):
    require_torch()
    pytest.importorskip("transformers", reason="pip install -r requirements-dev.txt")
    from mha_numpy.interop.bert_model import crosscheck_bert_model

    model = BertModel.from_pretrained(dtype=dtype)
    inputs = model.tokenize(SENTENCES)
    assert inputs.attention_mask.min() == 0  # a padded batch
    report = crosscheck_bert_model(model, inputs, rng=0)
    assert report.rtol == rtol
    assert len(report.rows) == 101 + 2
    assert report.passed, str(report)
    rel = [r.max_rel_err for r in report.rows if not r.zero]
    assert rel == sorted(rel, reverse=True)  # worst first
    assert report["d embeddings output"].max_rel_err <= rtol


@pytest.mark.parametrize("norm", ["post"])
def test_tiny_random_bert_matches_transformers_built_from_its_params(norm):
    require_torch()
    pytest.importorskip("transformers", reason="pip install -r requirements-dev.txt")
    from mha_numpy.interop.bert_model import crosscheck_bert_model

    model = tiny_bert(norm)
    ids, mask, types = tiny_inputs()
    report = crosscheck_bert_model(model, dict(input_ids=ids, attention_mask=mask, token_type_ids=types))
    assert report.passed, str(report)


@pytest.mark.parametrize("hidden_act", ["gelu_new", "gelu_pytorch_tanh"])
def test_tanh_gelu_bert_matches_transformers_because_the_block_passes_approximate_through(hidden_act):
    """transformers' tanh GELUs: the layer's feed-forward must use the tanh form (the exact one is ~1e-4 away)."""
    require_torch()
    pytest.importorskip("transformers", reason="pip install -r requirements-dev.txt")
    from mha_numpy.interop.bert_model import crosscheck_bert_model

    model = tiny_bert(hidden_act=hidden_act)
    assert all(layer.approximate == "tanh" for layer in model.layers)
    ids, mask, types = tiny_inputs()
    report = crosscheck_bert_model(model, dict(input_ids=ids, attention_mask=mask, token_type_ids=types))
    assert report.passed, str(report)
    with pytest.raises(ValueError, match="hidden_act"):
        tiny_bert(hidden_act="relu")


def test_cli_crosscheck_model_bert():
    require_torch()
    pytest.importorskip("transformers", reason="pip install -r requirements-dev.txt")
    r = subprocess.run(
        [sys.executable, "-m", "mha_numpy", "crosscheck", "--model", "bert", "--dtype", "float64"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "d embeddings output" in r.stdout and "RESULT: PASS" in r.stdout
    assert r.stdout.count("PASS") >= 103
    assert "Loading" not in r.stdout + r.stderr and "it/s" not in r.stderr  # no loading bar from transformers
