"""The encoder–decoder of models.seq2seq: central differences of every parameter tensor against a random upstream
gradient, the cached greedy decoding against the teacher-forced forward, the reversal task's accuracy target
reached by a seeded short training, and torch.nn.Transformer from the same weights (logits, every gradient, the
greedy decoding) to 1e-12 in float64. The expected numbers come from finite differences and from torch, never from
mha_numpy itself."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from helpers import require_torch

from mha_numpy import KVCache
from mha_numpy.models.seq2seq import (
    BOS,
    REVERSE_TARGET,
    Seq2SeqConfig,
    Seq2SeqModel,
    param_shapes,
    reverse_batch,
    sequence_accuracy,
    train_reverse,
)

SMALL = Seq2SeqConfig(vocab_size=7, d_model=8, nhead=2, dim_feedforward=12, num_encoder_layers=2,
                      num_decoder_layers=2, max_len=6)  # fmt: skip
TRAIN_STEPS = 80  # the seeded training of test_reverse_reaches_its_target (seed 0 reaches 1.0 from about step 60)


def small_inputs(seed=0):
    """src (3, 5) and tgt_in (3, 4): Ls != Lt, a repeated id in a row, BOS in the targets."""
    rng = np.random.default_rng(seed)
    src, tgt_in = rng.integers(0, SMALL.vocab_size, (3, 5)), rng.integers(0, SMALL.vocab_size, (3, 4))
    src[0, 1] = src[0, 3]
    tgt_in[:, 0] = BOS
    return src, tgt_in, rng.integers(0, SMALL.vocab_size, (3, 4))


@pytest.fixture(scope="module")
def trained():
    return train_reverse(steps=TRAIN_STEPS, seed=0)


def test_every_parameter_against_central_differences():
    """Three entries of every tensor (the largest analytic one among them), both decoder layers reading the memory
    (their gradients add up), against sum(logits * d) differenced; b_k's gradient is 0 in theory (softmax ignores a
    constant added to every score of a row) and is judged by its size against the largest gradient."""
    model = Seq2SeqModel.random(SMALL, rng=1)
    src, tgt_in, _ = small_inputs()
    out, cache = model.forward(src, tgt_in)
    rng = np.random.default_rng(2)
    d = rng.standard_normal(out.logits.shape)
    grads = model.backward(d, cache)
    largest = max(np.abs(g).max() for g in grads.values())
    eps = 1e-6
    for name, p in model.params.items():
        if name.endswith("attn.b_k"):
            assert np.abs(grads[name]).max() <= 1e-13 * largest, name
            continue
        flat = np.abs(grads[name]).ravel()
        picks = {int(flat.argmax()), *rng.choice(flat.size, size=min(2, flat.size), replace=False).tolist()}
        for i in picks:
            idx = np.unravel_index(i, p.shape)
            old = p[idx]
            p[idx] = old + eps
            up = (model.forward(src, tgt_in)[0].logits * d).sum()
            p[idx] = old - eps
            down = (model.forward(src, tgt_in)[0].logits * d).sum()
            p[idx] = old
            numeric = (up - down) / (2 * eps)
            scale = max(np.abs(grads[name]).max(), 1e-12)
            assert abs(numeric - grads[name][idx]) <= 1e-7 * scale, (name, idx, numeric, grads[name][idx])


def test_greedy_decoding_with_the_caches_is_the_teacher_forced_forward():
    """Each cached step's logits and cross-attention row equal the full forward on the decoded prefix; each layer's
    self-attention cache holds one position per step; the cross-attention K, V are the memory projected."""
    model = Seq2SeqModel.random(SMALL, rng=3)
    src, _, _ = small_inputs(4)
    n = 6
    dec = model.greedy_decode(src, n)
    tgt_in = np.concatenate([np.full((3, 1), BOS), dec.tokens[:, :-1]], axis=1)  # what the decoder read
    out, _ = model.forward(src, tgt_in)
    scale = np.abs(out.logits).max()
    assert np.abs(dec.logits - out.logits).max() <= 1e-12 * scale
    assert (dec.tokens == out.logits.argmax(-1)).all()
    for mine, full in zip(dec.cross_attentions, out.cross_attentions):
        assert mine.shape == full.shape == (3, SMALL.nhead, n, src.shape[1])
        assert np.abs(mine - full).max() <= 1e-12
    for kv, (K, V), layer in zip(dec.kv_caches, dec.cross_kv, model.decoder_layers):
        assert isinstance(kv, KVCache) and len(kv) == n and kv.keys.shape == (3, SMALL.nhead, n, 4)
        mha = layer.cross_attn
        _, c = mha.forward(np.zeros((3, 1, SMALL.d_model)), out.memory, out.memory)
        assert np.abs(c.K - K).max() <= 1e-12 * np.abs(K).max() and np.abs(c.V - V).max() <= 1e-12 * np.abs(V).max()


def test_decoding_cross_attention_is_the_module():
    """Decoding reads the memory through the cross-attention module, as training does (issue 34: it once wrote the
    data path out by hand): an option set on the module (a soft-cap) reaches both, so they still agree, and the
    cap shows in the weights."""
    model = Seq2SeqModel.random(SMALL, rng=5)
    src, _, _ = small_inputs(6)
    plain = model.greedy_decode(src, 5)
    for layer in model.decoder_layers:
        layer.cross_attn.softcap = 0.3  # scores capped to ±0.3: the maps flatten
    dec = model.greedy_decode(src, 5)
    tgt_in = np.concatenate([np.full((3, 1), BOS), dec.tokens[:, :-1]], axis=1)
    out, _ = model.forward(src, tgt_in)
    assert np.abs(dec.logits - out.logits).max() <= 1e-12 * np.abs(out.logits).max()
    for mine, full, before in zip(dec.cross_attentions, out.cross_attentions, plain.cross_attentions):
        assert np.abs(mine - full).max() <= 1e-12
        assert mine.max() < before.max() and mine.max() <= np.exp(0.6) / (np.exp(0.6) + src.shape[1] - 1)
    layer = model.decoder_layers[1]
    K, V = layer.cross_kv(out.memory)
    _, c = layer.cross_attn.forward(np.zeros((3, 2, SMALL.d_model)), out.memory, out.memory)
    assert np.array_equal(K, c.K) and np.array_equal(V, c.V) and K.shape == (3, SMALL.nhead, src.shape[1], 4)


def test_reverse_reaches_its_target(trained):
    """A seeded training of TRAIN_STEPS steps reverses >= REVERSE_TARGET of 500 held-out sequences exactly (greedy,
    with the caches), from an untrained model that reverses none; a learned cross-attention head reads source
    position L-1-t at target position t (the anti-diagonal)."""
    L = trained.labels.shape[1]
    untrained = Seq2SeqModel.random(trained.model.config, rng=0)
    assert sequence_accuracy(untrained, trained.src, trained.labels) < 0.05
    assert trained.accuracy >= REVERSE_TARGET
    assert trained.history["loss"][-1] < 0.1 * trained.history["loss"][0]
    tgt_in = np.concatenate([np.full((len(trained.src), 1), BOS), trained.labels[:, :-1]], axis=1)
    cross = trained.model.forward(trained.src, tgt_in)[0].cross_attentions[0].mean(axis=0)  # (H, L, L)
    on_anti_diagonal = cross[:, np.arange(L), L - 1 - np.arange(L)].mean(axis=1)  # (H,) mean weight per head
    assert on_anti_diagonal.max() >= 0.9, on_anti_diagonal


def test_matches_torch_transformer_random_weights():
    """Two encoder and two decoder layers, random weights: logits, loss, every gradient, the greedy decoding (tokens
    and each step's logits) against torch.nn.Transformer from the same weights, to 1e-12."""
    require_torch()
    from mha_numpy.interop.seq2seq import crosscheck_seq2seq

    model = Seq2SeqModel.random(SMALL, rng=1)
    src, tgt_in, labels = small_inputs()
    report = crosscheck_seq2seq(model, src, tgt_in, labels, decode_length=6)
    assert report.passed, str(report)
    assert len(report.rows) == 2 + len(model.params) + 2 and report.rtol == 1e-12
    assert sum(r.zero for r in report.rows) == 6  # the b_k of the 6 attentions, and only those


def test_matches_torch_transformer_without_an_encoder_layer():
    """0 encoder layers, which the model accepts (the memory is the final norm of the embeddings): torch's
    TransformerEncoder cannot run without a layer (it reads layers[0]), so the twin applies the norm alone; the
    cross-check compares everything as with layers (issue 35: it crashed with an IndexError)."""
    require_torch()
    from mha_numpy.interop.seq2seq import crosscheck_seq2seq

    model = Seq2SeqModel.random(dataclasses.replace(SMALL, num_encoder_layers=0), rng=2)
    src, tgt_in, labels = small_inputs(1)
    report = crosscheck_seq2seq(model, src, tgt_in, labels, decode_length=6)
    assert report.passed, str(report)
    assert not any(r.name.startswith("d encoder.layers") for r in report.rows)
    assert len(report.rows) == 2 + len(model.params) + 2 and report.rtol == 1e-12
    assert sum(r.zero for r in report.rows) == 4  # the b_k of the decoder's 4 attentions, and only those


def test_matches_torch_transformer_trained(trained):
    """The trained model: torch decodes the held-out sequences exactly as we do, and reverses them as well."""
    require_torch()
    from mha_numpy.interop.seq2seq import crosscheck_seq2seq

    src, tgt_in, labels = reverse_batch(np.random.default_rng(7), 16, 8, trained.model.config.vocab_size)
    report = crosscheck_seq2seq(trained.model, src, tgt_in, labels)
    assert report.passed, str(report)
    assert (trained.model.greedy_decode(src, 8).tokens == labels).all(axis=1).mean() >= REVERSE_TARGET


def test_float32_stays_float32_and_agrees():
    weights = Seq2SeqModel.random(SMALL, rng=1).params
    m64, m32 = Seq2SeqModel(SMALL, weights), Seq2SeqModel(SMALL, weights, dtype=np.float32)
    src, tgt_in, labels = small_inputs()
    l64, o64, g64 = m64.loss_and_grads(src, tgt_in, labels)
    l32, o32, g32 = m32.loss_and_grads(src, tgt_in, labels)
    assert o32.logits.dtype == np.float32 and all(g.dtype == np.float32 for g in g32.values())
    assert abs(l32 - l64) <= 1e-5 * abs(l64)
    largest = max(np.abs(g).max() for g in g64.values())
    assert max(np.abs(g32[n] - g64[n]).max() for n in g64) <= 1e-4 * largest


def test_bad_input_names_the_argument():
    model = Seq2SeqModel.random(SMALL, rng=0)
    src, tgt_in, _ = small_inputs()
    before = {n: p.copy() for n, p in model.params.items()}
    cases = [
        ((src + 7, tgt_in), "src"),
        ((src, tgt_in[:2]), "batch size"),
        ((src.astype(float), tgt_in), "src"),
        ((np.zeros((3, 7), int), tgt_in), "max_len"),
        ((src[:, :0], tgt_in), "src"),
    ]
    for args, words in cases:
        with pytest.raises(ValueError, match=words):
            model.forward(*args)
    out, cache = model.forward(src, tgt_in)
    with pytest.raises(ValueError, match="d_logits"):
        model.backward(out.logits[:, :-1], cache)
    with pytest.raises(ValueError, match="cache"):
        Seq2SeqModel.random(SMALL, rng=0).backward(out.logits, cache)
    with pytest.raises(ValueError, match="length"):
        model.greedy_decode(src, 7)
    with pytest.raises(ValueError, match="weight src_pos.weight"):
        Seq2SeqModel(SMALL, {**before, "src_pos.weight": np.zeros((5, 8))})
    with pytest.raises(ValueError, match="num_decoder_layers"):
        Seq2SeqModel.random(Seq2SeqConfig(num_decoder_layers=0))
    with pytest.raises(ValueError, match="lack 1"):
        Seq2SeqModel(SMALL, {n: p for n, p in before.items() if n != "generator.bias"})
    assert all(np.array_equal(model.params[n], before[n]) for n in before)  # nothing was touched
    assert list(model.params) == list(param_shapes(SMALL))
