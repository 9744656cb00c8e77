"""Bad sizes of the encoder–decoder and its reversal task are ValueErrors naming the argument, before any arithmetic
(issue 35: nhead=0 and dim_feedforward=0 raised ZeroDivisionError; vocab_size=0, max_len=0 and a negative
layer_norm_eps were accepted; reverse_batch and train_reverse(eval_size=0) failed with NumPy's errors); and the same
for the tiny model's task batches (mha_numpy.train)."""

from __future__ import annotations

import numpy as np
import pytest

from mha_numpy import train as T
from mha_numpy.models.seq2seq import Seq2SeqConfig, Seq2SeqModel, reverse_batch, train_reverse

BAD_CONFIGS = [
    (dict(nhead=0), "nhead"),
    (dict(dim_feedforward=0), "dim_feedforward"),
    (dict(vocab_size=0), "vocab_size"),
    (dict(max_len=0), "max_len"),
    (dict(layer_norm_eps=-1e-5), "layer_norm_eps"),
    (dict(layer_norm_eps=0.0), "layer_norm_eps"),
    (dict(layer_norm_eps=float("nan")), "layer_norm_eps"),
    (dict(d_model=0), "d_model"),
    (dict(d_model=32.0), "d_model"),
    (dict(nhead=-2), "nhead"),
    (dict(num_encoder_layers=-1), "num_encoder_layers"),
    (dict(num_decoder_layers=0), "num_decoder_layers"),
    (dict(d_model=30, nhead=4), "d_model=30 is not divisible by nhead=4"),
]


@pytest.mark.parametrize("fields, words", BAD_CONFIGS, ids=[w.split()[0] + str(f) for f, w in BAD_CONFIGS])
def test_a_bad_config_is_a_value_error_naming_the_field(fields, words):
    with pytest.raises(ValueError, match=words):
        Seq2SeqConfig(**fields)


def test_a_good_config_keeps_its_values_and_builds():
    c = Seq2SeqConfig(vocab_size=np.int64(5), d_model=8, nhead=2, dim_feedforward=4, num_encoder_layers=0, max_len=3)
    assert c.vocab_size == 5 and type(c.vocab_size) is int and c.layer_norm_eps == 1e-5
    out, _ = Seq2SeqModel.random(c).forward(np.ones((1, 3), dtype=int), np.zeros((1, 2), dtype=int))
    assert out.logits.shape == (1, 2, 5) and np.isfinite(out.logits).all()
    with pytest.raises(ValueError, match="config must be a Seq2SeqConfig"):
        Seq2SeqModel({"vocab_size": 5}, {})


@pytest.mark.parametrize(
    "args, words",
    [
        ((3, 4, 0), "vocab_size"),
        ((3, 4, 1), "vocab_size"),  # only BOS: no symbol to reverse
        ((0, 4, 5), "batch"),
        ((-1, 4, 5), "batch"),
        ((3, 0, 5), "length"),
        ((3, 2.0, 5), "length"),
    ],
)
def test_reverse_batch_refuses_bad_sizes(args, words):
    with pytest.raises(ValueError, match=words):
        reverse_batch(np.random.default_rng(0), *args)


def test_reverse_batch_is_the_reversed_source():
    src, tgt_in, labels = reverse_batch(np.random.default_rng(0), 3, 4, 2)  # the smallest vocabulary: one symbol
    assert (src == 1).all() and (labels == 1).all() and (tgt_in[:, 0] == 0).all() and (tgt_in[:, 1:] == 1).all()


@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(eval_size=0), "eval_size"),
        (dict(eval_size=-3), "eval_size"),
        (dict(config=Seq2SeqConfig(vocab_size=1)), "vocab_size"),
        (dict(config={"vocab_size": 11}), "config"),
    ],
)
def test_train_reverse_refuses_before_training(kwargs, words, monkeypatch):
    def no_model(*args, **kw):  # the refusal comes before any model is made
        raise AssertionError("a model was made before the arguments were checked")

    monkeypatch.setattr(Seq2SeqModel, "random", no_model)
    with pytest.raises(ValueError, match=words):
        train_reverse(**{"steps": 1, **kwargs})


@pytest.mark.parametrize(
    "args, words",
    [((0, 4, 5), "batch_size"), ((3, 0, 5), "length"), ((3, 4, 0), "vocab_size"), ((-1, 4, 5), "batch_size")],
)
def test_tiny_models_task_batches_refuse_bad_sizes(args, words):
    with pytest.raises(ValueError, match=words):
        T.make_batch("reverse", np.random.default_rng(0), *args)
    if words == "length":
        with pytest.raises(ValueError, match="length"):
            T.ideal_attention("reverse", -1)
