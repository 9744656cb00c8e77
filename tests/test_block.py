"""The generic Transformer block (models.block): every configuration against central differences, the names table
as data, GELU's approximation passed through, positions and the KV cache passed to the attention, bad arguments.
BERT, the tiny model and the Llama decoder are checked as whole models elsewhere (test_bert*, test_train,
test_decoder)."""

from __future__ import annotations

import numpy as np
import pytest

from mha_numpy import KVCache, masks
from mha_numpy import functional as F
from mha_numpy.attention import MultiHeadAttention
from mha_numpy.gradcheck import GradcheckReport, numerical_gradient
from mha_numpy.models import layers as LY
from mha_numpy.models.block import FFN_ROLES, NORM_ROLES, Block

E, H, I = 8, 4, 12


def make_block(norm_position, norm, ffn, approximate="none", llama=False, dropout=0.0, seed=0):
    """A block with random weights under made-up names 'p.<role>'; ``llama``: no biases, GQA (Hkv = 2), RoPE."""
    rng = np.random.default_rng(seed)
    options = dict(bias=False, num_kv_heads=2, rope_theta=100.0) if llama else dict(bias=True)
    attention = MultiHeadAttention(E, H, dropout=dropout, rng=seed, **options)
    shapes = {role: p.shape for role, p in attention.params.items()}
    shapes.update({f"norm{i}.{w}": (E,) for i in (1, 2) for w in NORM_ROLES[norm]})
    ffn_shapes = {"W_1": (I, E), "b_1": (I,), "W_2": (E, I), "b_2": (E,), "W_gate": (I, E), "W_up": (I, E),
                  "W_down": (E, I)}  # fmt: skip
    shapes.update({role: ffn_shapes[role] for role in FFN_ROLES[ffn]})
    params = {f"layer.{role}": rng.normal(0, 0.5, shape) for role, shape in shapes.items()}
    for i in (1, 2):
        params[f"layer.norm{i}.weight"] += 1.0  # norm gains around 1
    names = {role: role for role in shapes}
    block = Block(attention, params, names, "layer.", norm_position=norm_position, norm=norm, eps=1e-6, ffn=ffn,
                  approximate=approximate, dropout=dropout)  # fmt: skip
    return block, params


CONFIGS = [  # (norm_position, norm, ffn, approximate, llama)
    ("post", "layer_norm", "gelu", "none", False),  # BERT
    ("pre", "layer_norm", "gelu", "tanh", False),  # GPT-2
    ("pre", "rms_norm", "swiglu", "none", True),  # Llama
    ("post", "rms_norm", "swiglu", "none", True),
]


@pytest.mark.parametrize("norm_position, norm, ffn, approximate, llama", CONFIGS)
def test_every_configuration_passes_finite_differences(norm_position, norm, ffn, approximate, llama):
    block, params = make_block(norm_position, norm, ffn, approximate, llama)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 5, E))
    mask = masks.combine_masks(masks.causal_mask(5), masks.padding_mask([5, 3], 5)) if llama else None
    y, cache = block.forward(x, mask)
    d = rng.standard_normal(y.shape)
    d_x, grads = block.backward(d, cache)
    assert sorted(grads) == sorted(params)
    # atol: central differences of a sum over 80 outputs of size ~1-10 carry ~1e-8 of rounding at eps = 1e-6; the
    # largest gradients are ~1-10, so 5e-8 is still ~1e-8 relative to the largest (as in test_bert_backward)
    report = GradcheckReport(atol=5e-8, rtol=1e-6)
    report.add("x", d_x, numerical_gradient(lambda x_: block.forward(x_, mask)[0], x.copy(), d))
    for name, p in params.items():
        report.add(name, grads[name], numerical_gradient(lambda _p: block.forward(x, mask)[0], p, d))
    assert report.passed, str(report)
    assert max(r.max_rel_err for r in report.rows) <= 1e-7, str(report)


def test_dropout_keep_masks_by_role_pass_finite_differences():
    block, params = make_block("post", "layer_norm", "gelu", dropout=0.3)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 4, E))
    keep = {"attention": rng.random((2, H, 4, 4)) >= 0.3, "attention_output": rng.random(x.shape) >= 0.3,
            "ffn_output": rng.random(x.shape) >= 0.3}  # fmt: skip
    y, cache = block.forward(x, None, keep)
    assert not np.allclose(y, block.forward(x)[0])  # the masks are used
    with pytest.raises(ValueError, match="attention_output"):
        block.forward(x, None, {"output": keep["ffn_output"]})  # BERT's site name, not the block's role
    d = rng.standard_normal(y.shape)
    d_x, grads = block.backward(d, cache)
    report = GradcheckReport(atol=5e-8, rtol=1e-6)
    report.add("x", d_x, numerical_gradient(lambda x_: block.forward(x_, None, keep)[0], x.copy(), d))
    for name, p in params.items():
        report.add(name, grads[name], numerical_gradient(lambda _p: block.forward(x, None, keep)[0], p, d))
    assert report.passed, str(report)


def test_pre_norm_equals_its_composition_of_pairs_and_passes_gelu_approximate_through():
    """The pre-norm GELU block, written out with the pairs: y = h + FFN(LN2 h), h = x + MHA(LN1 x)."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 3, E))
    outs = {}
    for approximate in ("none", "tanh"):
        block, p = make_block("pre", "layer_norm", "gelu", approximate)
        n1 = LY.layer_norm(x, p["layer.norm1.weight"], p["layer.norm1.bias"], 1e-6)
        h = x + block.attention.forward(n1, n1, n1)[0]
        n2 = LY.layer_norm(h, p["layer.norm2.weight"], p["layer.norm2.bias"], 1e-6)
        g = LY.gelu(F.linear_forward(n2, p["layer.W_1"], p["layer.b_1"])[0], approximate)
        y = h + F.linear_forward(g, p["layer.W_2"], p["layer.b_2"])[0]
        outs[approximate] = block.forward(x)[0]
        np.testing.assert_array_equal(outs[approximate], y)
    assert np.abs(outs["none"] - outs["tanh"]).max() > 1e-6  # the approximation reached the feed-forward


def test_the_block_reads_params_by_name_at_every_forward():
    block, params = make_block("pre", "rms_norm", "swiglu", llama=True)
    x = np.random.default_rng(4).standard_normal((1, 3, E))
    before = block.forward(x)[0]
    params["layer.W_q"] = params["layer.W_q"] * 2.0  # replaced, as an optimizer may do
    params["layer.norm2.weight"][...] = 0.0  # updated in place: the feed-forward now sees zeros
    after = block.forward(x)[0]
    assert block.attention.params["W_q"] is params["layer.W_q"]
    assert not np.allclose(before, after)


def test_positions_and_kv_cache_pass_through_to_the_attention():
    """Decoding token by token with a KVCache equals the causal forward over the whole sequence; shifting every
    RoPE position by the same amount changes nothing (RoPE sees differences only)."""
    block, _ = make_block("pre", "rms_norm", "swiglu", llama=True)
    x = np.random.default_rng(5).standard_normal((2, 6, E))
    full, _ = block.forward(x, masks.causal_mask(6))
    kv = KVCache()
    steps = [block.forward(x[:, :2], kv_cache=kv)[0]] + [block.forward(x[:, t : t + 1], kv_cache=kv)[0]
                                                           for t in range(2, 6)]  # fmt: skip
    assert len(kv) == 6
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, rtol=0, atol=1e-13 * np.abs(full).max())
    shifted, _ = block.forward(x, masks.causal_mask(6), positions=np.arange(6) + 7)
    np.testing.assert_allclose(shifted, full, rtol=0, atol=1e-13 * np.abs(full).max())


def test_names_are_checked_against_the_roles_and_the_params():
    block, params = make_block("pre", "rms_norm", "swiglu", llama=True)
    names, mha = block.names, block.attention
    kw = dict(norm_position="pre", norm="rms_norm", eps=1e-6, ffn="swiglu")
    with pytest.raises(ValueError, match=r"missing \['W_up'\]"):
        Block(mha, params, {r: n for r, n in names.items() if r != "W_up"}, "layer.", **kw)
    with pytest.raises(ValueError, match=r"unknown \['b_q'\]"):
        Block(mha, params, {**names, "b_q": "b_q"}, "layer.", **kw)
    with pytest.raises(ValueError, match="params lacks"):
        Block(mha, params, names, "other.", **kw)
    with pytest.raises(ValueError, match="norm1.bias"):  # a LayerNorm needs a bias the RMSNorm table lacks
        Block(mha, params, names, "layer.", **{**kw, "norm": "layer_norm"})
    bad = {**params, "layer.norm1.weight": np.ones(E + 1)}
    with pytest.raises(ValueError, match=r"layer.norm1.weight.*\(9,\)"):
        Block(mha, bad, names, "layer.", **kw)


@pytest.mark.parametrize("arg, value", [("norm_position", "sandwich"), ("norm", "batch_norm"), ("ffn", "relu"),
                                        ("approximate", "sigmoid"), ("dropout", 1.0)])  # fmt: skip
def test_bad_configuration_raises_naming_the_argument(arg, value):
    block, params = make_block("pre", "rms_norm", "swiglu", llama=True)
    kw = dict(norm_position="pre", norm="rms_norm", eps=1e-6, ffn="swiglu")
    with pytest.raises(ValueError, match=arg):
        Block(block.attention, params, block.names, "layer.", **{**kw, arg: value})
    with pytest.raises(ValueError, match="attention"):
        Block(object(), params, block.names, "layer.", **kw)
