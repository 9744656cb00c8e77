"""The hybrid decoder (models/hybrid.py): layers in the order of ``layer_types``, each the generic Block with its token
mixer swapped; decoding with every layer's cache against the full forward, the refusals, and the backward against
central differences (the torch cross-check and the training run below)."""

import numpy as np
import pytest
from helpers import require_torch

from mha_numpy.attention import MultiHeadAttention
from mha_numpy.kv_cache import KVCache
from mha_numpy.models.block import Block
from mha_numpy.models.hybrid import LAYER_KINDS, HybridConfig, HybridModel, param_shapes
from mha_numpy.models.mixers import RecurrentCache
from mha_numpy.recurrent.mamba2 import Mamba2Mixer
from mha_numpy.recurrent.qwen3_next import GatedDeltaNet

ORDERS = [
    ("linear_attention", "full_attention"),
    ("full_attention", "linear_attention", "linear_attention"),
    ("linear_attention", "linear_attention", "linear_attention", "full_attention"),  # Qwen3-Next's 3:1 pattern
    ("mamba", "full_attention", "linear_attention", "mamba"),  # all three kinds
]
WORDS = {"full_attention": "self_attn.q_proj", "linear_attention": "linear_attn.in_proj_qkvz", "mamba": "mamba.in_proj"}


def tiny(layer_types, vocab_size=11, hidden_size=16, std=0.3, chunk_size=4, **kw) -> HybridModel:
    """A tiny random hybrid whose weights are large enough that every layer changes the logits visibly."""
    config = HybridConfig(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=24,
                          layer_types=layer_types, chunk_size=chunk_size, **kw)  # fmt: skip
    return HybridModel.random(config, rng=0, std=std)


@pytest.mark.parametrize("layer_types", ORDERS)
def test_layers_follow_layer_types_one_block_class(layer_types):
    """Every layer is a Block, its mixer of the kind its layer_types entry names, and its parameters under
    Qwen3-Next's names (self_attn.* for attention, linear_attn.* for Gated DeltaNet)."""
    model = tiny(layer_types)
    assert all(type(layer) is Block for layer in model.layers)
    kinds = {"full_attention": MultiHeadAttention, "linear_attention": GatedDeltaNet, "mamba": Mamba2Mixer}
    mixers = [getattr(layer.mixer, "attention", getattr(layer.mixer, "layer", None)) for layer in model.layers]
    assert [type(m) for m in mixers] == [kinds[t] for t in layer_types]
    for i, kind in enumerate(layer_types):
        assert f"layers.{i}.{WORDS[kind]}.weight" in model.params
    assert list(model.params) == list(param_shapes(model.config))


@pytest.mark.parametrize("layer_types", ORDERS)
@pytest.mark.parametrize("prefill", [1, 4])
def test_decoding_token_by_token_equals_the_full_forward(layer_types, prefill):
    """A prefill, then one token a call with every layer's cache (KV for attention, conv + state for Gated
    DeltaNet): the logits of the one full call to 1e-12, and the caches' lengths and kinds as the layers'."""
    model = tiny(layer_types)
    ids = np.random.default_rng(1).integers(0, 11, (2, 9))
    full = model(ids)
    caches = model.new_caches()
    steps = [model(ids[:, :prefill], caches=caches)]
    sizes = [c.nbytes for c in caches]
    steps += [model(ids[:, t : t + 1], caches=caches) for t in range(prefill, 9)]
    decoded = np.concatenate(steps, axis=1)
    assert np.abs(decoded - full).max() <= 1e-12 * np.abs(full).max()
    assert [type(c) for c in caches] == [KVCache if t == "full_attention" else RecurrentCache for t in layer_types]
    assert {len(c) for c in caches} == {9}
    # the recurrent state is the same size after 9 tokens as after the prefill; the KV cache grew
    assert [c.nbytes == n for c, n in zip(caches, sizes)] == [t != "full_attention" for t in layer_types]


def test_generate_uses_the_caches_as_the_full_forward_would():
    """Greedy decoding through the caches picks, at every step, the argmax of the full forward of the text so far."""
    model = tiny(ORDERS[1])
    prompt = np.random.default_rng(3).integers(0, 11, (3, 5))
    new = model.generate(prompt, 4)
    text = np.concatenate([prompt, new], axis=1)
    assert np.array_equal(model(text[:, :-1])[:, 4:].argmax(-1), new)


def test_a_layer_type_that_does_not_exist_is_refused_naming_it():
    for bad in (("linear_attention", "sliding_attention"), ("mamba2",)):
        with pytest.raises(ValueError, match=r"layer_types\[\d\] = '(sliding_attention|mamba2)'"):
            HybridConfig(vocab_size=5, hidden_size=8, intermediate_size=8, layer_types=bad)
    for bad in ("full_attention", (), None):  # a string is not a list of layers
        with pytest.raises(ValueError, match="layer_types must be"):
            HybridConfig(vocab_size=5, hidden_size=8, intermediate_size=8, layer_types=bad)


def test_caches_of_the_wrong_kind_are_refused_naming_the_argument():
    model = tiny(("linear_attention", "full_attention"))
    ids = np.zeros((1, 2), np.int64)
    swapped = model.new_caches()[::-1]
    with pytest.raises(ValueError, match=r"caches\[0\] is a KVCache, but layer 0 is 'linear_attention'"):
        model(ids, caches=swapped)
    with pytest.raises(ValueError, match=r"caches\[1\] is a RecurrentCache, but layer 1 is 'full_attention'"):
        model(ids, caches=[RecurrentCache(), RecurrentCache()])
    with pytest.raises(ValueError, match="caches must be a list of 2"):
        model(ids, caches=model.new_caches()[:1])
    caches = model.new_caches()
    model(ids, caches=[caches[0], KVCache()])  # a fresh cache of the right kind is taken ...
    with pytest.raises(ValueError, match="caches must all hold the same number of tokens"):
        model(ids, caches=[caches[0], KVCache()])  # ... but not beside one that has seen two tokens
    _, cache = model.forward(ids, caches=model.new_caches())
    with pytest.raises(ValueError, match="decoding is forward only"):
        model.backward(np.ones((1, 2, 11)), cache)


def test_a_recurrent_cache_of_the_other_recurrent_kind_is_refused():
    """Gated DeltaNet's and Mamba-2's caches are both RecurrentCache: once one holds a state, a layer of the other
    kind refuses it by name (caches[i], the state's kind), before any arithmetic."""
    model = tiny(("linear_attention", "mamba"))
    ids = np.zeros((1, 2), np.int64)
    caches = model.new_caches()
    model(ids, caches=caches)
    with pytest.raises(ValueError, match=r"caches\[0\] is a RecurrentCache holding a Mamba2State, but layer 0 is "
                                         r"'linear_attention': it needs a RecurrentCache"):  # fmt: skip
        model(ids, caches=caches[::-1])
    assert [len(c) for c in caches] == [2, 2]  # the refused call touched neither


def test_caches_of_another_batch_are_refused_before_any_layer_runs():
    """Every cache is checked against input_ids' batch first: a call refused at layer 1 or 2 must not have advanced
    layer 0's cache (the caches would disagree on the text so far)."""
    model = tiny(("linear_attention", "full_attention", "mamba"))
    two, three = model.new_caches(), model.new_caches()
    model(np.zeros((2, 3), np.int64), caches=two)
    model(np.zeros((3, 3), np.int64), caches=three)
    for i in (1, 2):
        mixed = [three[0], *two[1:]] if i == 1 else [*three[:2], two[2]]
        with pytest.raises(ValueError, match=rf"caches\[{i}\] holds a batch of 2 sequences, input_ids has 3"):
            model(np.zeros((3, 1), np.int64), caches=mixed)
        assert [len(c) for c in three] == [3, 3, 3]


def test_a_recurrent_mixer_takes_no_mask():
    """A Gated DeltaNet layer is causal by its recurrence: a mask passed to it is a mistake, refused by name."""
    model = tiny(("linear_attention",))
    block = model.layers[0]
    with pytest.raises(ValueError, match="mask must be None for a recurrent mixer"):
        block.forward(np.zeros((1, 3, 16)), np.ones((3, 3), bool))


def test_every_gradient_against_central_differences():
    """Float64 central differences of <d_logits, logits> on every parameter of a three-layer hybrid (the three kinds,
    tiny sizes): a few entries of each tensor, the largest-gradient one among them, to 1e-7 of that tensor's
    largest gradient plus the differences' own rounding."""
    model = tiny(("linear_attention", "full_attention", "mamba"), vocab_size=5, hidden_size=8,
                 linear_key_head_dim=4, linear_value_head_dim=4, num_attention_heads=2, mamba_d_state=4)  # fmt: skip
    rng = np.random.default_rng(5)
    ids = rng.integers(0, 5, (2, 6))
    d_logits = rng.standard_normal((2, 6, 5))
    logits, cache = model.forward(ids)
    grads = model.backward(d_logits, cache)
    assert list(grads) == list(model.params)
    eps = 1e-6
    noise = 1e-16 * np.abs(logits * d_logits).sum() / eps  # the rounding of <d_logits, logits> over 2 eps
    for name, p in model.params.items():
        flat = p.reshape(-1)
        picks = {int(np.abs(grads[name]).argmax()), *rng.choice(flat.size, min(3, flat.size), replace=False).tolist()}
        for j in picks:
            old = flat[j]
            flat[j] = old + eps
            plus = np.sum(model(ids) * d_logits)
            flat[j] = old - eps
            minus = np.sum(model(ids) * d_logits)
            flat[j] = old
            numeric = (plus - minus) / (2 * eps)
            scale = np.abs(grads[name]).max()
            assert abs(numeric - grads[name].reshape(-1)[j]) <= 1e-7 * scale + noise, (name, j)


def test_the_registry_is_the_one_place_a_kind_is_named():
    """A layer kind is one LAYER_KINDS entry: its mixer builder and its names; the config refuses what it lacks."""
    assert set(LAYER_KINDS) == {"full_attention", "linear_attention", "mamba"}
    for kind in LAYER_KINDS.values():
        assert kind.names and callable(kind.build)


@pytest.mark.parametrize(
    "layer_types, heads",
    [
        (("linear_attention", "full_attention", "mamba"), (2, 1)),
        (("full_attention", "mamba", "linear_attention"), (4, 2)),
    ],
)
def test_backward_against_a_transformers_twin_under_autograd(layer_types, heads):
    """The whole stack against its twin built from transformers' layers (LlamaDecoderLayer for attention,
    Qwen3NextGatedDeltaNet and Mamba2Mixer in the same frame, float32 casts lifted), float64: the logits and every
    parameter's gradient to 1e-10 of the largest."""
    require_torch()
    pytest.importorskip("transformers", reason="transformers is not installed: pip install -r requirements-dev.txt")
    from mha_numpy.interop.hybrid_model import crosscheck_hf_hybrid

    model = tiny(layer_types, num_attention_heads=heads[0], num_key_value_heads=heads[1])
    ids = np.random.default_rng(1).integers(0, 11, (2, 9))  # 9 tokens: the DeltaNet core runs three chunks of 4
    report = crosscheck_hf_hybrid(model, ids)
    assert report.passed, str(report)
    assert len(report.rows) == 1 + len(model.params)


def test_trained_with_our_backward_on_notebook_07s_task_to_its_accuracy():
    """Notebook 07's reverse (L = 8, V = 10) as a decoder sees it, trained as a new user runs it (the defaults:
    linear_attention then full_attention, E = 32, 250 Adam steps, about 5 s): every held-out answer token right
    (the notebook's 1.0), and every whole reversal right when generated through the layers' caches."""
    from mha_numpy.train_hybrid import train_hybrid

    result = train_hybrid(log=None, eval_size=500)
    assert result.token_accuracy == 1.0
    assert result.sequence_accuracy == 1.0
    assert result.history["loss"][-1] < 0.02 < result.history["loss"][0]


def test_train_hybrid_command_line_mistake_is_one_line_and_exit_2(capsys):
    from mha_numpy.train_hybrid import main

    assert main(["--layer-types", "linear_attention,mamba2", "--steps", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "layer_types[1] = 'mamba2' is not a layer kind" in err


def test_reverse_prompt_batch_layout():
    """[x, SEP, y without its last token] and y = x reversed; SEP is the extra token vocab_size."""
    from mha_numpy.train_hybrid import reverse_prompt_batch

    ids, y = reverse_prompt_batch(np.random.default_rng(0), 3, 4, 10)
    assert ids.shape == (3, 8) and y.shape == (3, 4)
    assert np.array_equal(y, ids[:, :4][:, ::-1]) and np.all(ids[:, 4] == 10)
    assert np.array_equal(ids[:, 5:], y[:, :3])


def test_float32_stays_float32():
    model64 = tiny(ORDERS[3])  # all three kinds
    model32 = HybridModel(model64.config, model64.params, dtype=np.float32)
    ids = np.random.default_rng(1).integers(0, 11, (2, 5))
    logits, cache = model32.forward(ids)
    grads = model32.backward(np.ones_like(logits), cache)
    assert logits.dtype == np.float32 and {g.dtype for g in grads.values()} == {np.dtype(np.float32)}


def test_the_generic_block_takes_any_recurrent_layer():
    """Block over Kimi Delta Attention (not a hybrid kind): the same block class, the layer's parameters under the
    names given, decoding through a RecurrentCache equal to the full call, a gradient for every role."""
    from mha_numpy.models.mixers import RecurrentMixer
    from mha_numpy.recurrent.kimi import KimiDeltaAttention

    mixer = RecurrentMixer(KimiDeltaAttention(12, 2, 4, chunk_size=3, rng=0))
    rng = np.random.default_rng(0)
    params = {f"kda.{n}": p.copy() for n, p in mixer.params.items()}
    params.update(
        {n: rng.normal(0, 0.3, s) for n, s in (("W_gate", (20, 12)), ("W_up", (20, 12)), ("W_down", (12, 20)))}
    )
    params.update({"n1": np.ones(12), "n2": np.ones(12)})
    names = {**{n: f"kda.{n}" for n in mixer.params}, "W_gate": "W_gate", "W_up": "W_up", "W_down": "W_down",
             "norm1.weight": "n1", "norm2.weight": "n2"}  # fmt: skip
    block = Block(mixer, params, names, norm_position="pre", norm="rms_norm", eps=1e-6, ffn="swiglu")
    x = rng.standard_normal((2, 7, 12))
    y, cache = block.forward(x)
    d_x, g = block.backward(np.ones_like(y), cache)
    assert d_x.shape == x.shape and set(g) == set(params)
    kv = mixer.new_cache()
    pieces = [block.forward(x[:, :3], kv_cache=kv)[0]] + [
        block.forward(x[:, t : t + 1], kv_cache=kv)[0] for t in range(3, 7)
    ]
    assert np.abs(np.concatenate(pieces, axis=1) - y).max() <= 1e-12 * np.abs(y).max()
