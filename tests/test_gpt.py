"""The capstone's GPT: the corpus and its split, the byte tokenizer, the bigram baseline against a hand count, the
model's gradients against central differences, and ``python -m mha_numpy gpt`` run small (it must beat the bigram)."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from helpers import rel_err

from mha_numpy.__main__ import main
from mha_numpy.data import corpus as C
from mha_numpy.gradcheck import numerical_gradient
from mha_numpy.models.gpt import GPT, GPTConfig
from mha_numpy.train_gpt import evaluate


def test_corpus_is_the_king_james_bible_split_by_chapter():
    chapters = C.load_chapters()
    assert len(chapters) == 1189  # the chapters of the 66 books of the Protestant canon
    assert chapters[0].startswith("In the beginning God created the heaven and the earth.\n")
    assert not re.search(r"[{}]", "".join(chapters))  # the braces of the translators' italics and notes are gone
    split = C.split_chapters(chapters)
    assert split.validation.startswith(chapters[9]) and split.train.startswith(chapters[0] + chapters[1])
    assert len(split.train) + len(split.validation) == sum(map(len, chapters))


def test_byte_tokenizer_is_exact():
    tok, text = C.ByteTokenizer(), "In the beginning «was» the Word.\n"
    ids = tok.encode(text)
    assert ids.dtype == np.int64 and len(ids) == len(text.encode("utf-8")) == len(text) + 2  # « and » take 2 bytes
    assert tok.decode(ids) == text


def test_bigram_cross_entropy_against_a_hand_count():
    # train pairs: (0,1) twice, (1,0), (1,1): p(1 | 0) = (2 + α) / (2 + 2α); validation's one pair is (0, 1)
    train, val = np.array([0, 1, 0, 1, 1]), np.array([0, 1])
    for alpha in (1.0, 0.5):
        expected = -math.log((2 + alpha) / (2 + 2 * alpha))
        assert C.bigram_cross_entropy(train, val, alpha, vocab_size=2) == pytest.approx(expected, rel=1e-15)
    with pytest.raises(ValueError, match="alpha"):
        C.bigram_cross_entropy(train, val, 0.0, vocab_size=2)


def test_gpt_gradients_against_central_differences():
    config = GPTConfig(vocab_size=7, context=5, hidden_size=8, num_layers=2, num_heads=2, intermediate_size=12)
    model = GPT(config, dtype=np.float64, rng=1, std=0.5)  # large weights: every path carries gradient
    ids = np.random.default_rng(2).integers(0, 7, (2, 6))
    _, grads = model.loss_and_grads(ids)
    for name in ("lm_head.weight", "embed_tokens.weight", "layers.0.self_attn.q_proj.weight", "norm.weight"):
        p = model.params[name]
        numeric = numerical_gradient(lambda _: np.array(model.loss(ids)), p, np.array(1.0))
        assert rel_err(grads[name], numeric) < 1e-7, name


def test_gpt_command_small_beats_the_bigram(tmp_path, capsys):
    argv = ["gpt", "--steps", "120", "--batch", "16", "--context", "32", "--hidden", "64", "--layers", "1",
            "--heads", "2", "--lr", "1e-2", "--train-bytes", "200000", "--val-bytes", "20000", "--sample", "40",
            "--out", str(tmp_path)]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    result = dict(re.findall(r"(\w+)=([\d.]+)", out.splitlines()[-1]))
    assert float(result["val_loss"]) < float(result["bigram"])  # measured 0.95 of it at these sizes
    assert "sample:\nAnd God said" in out and (tmp_path / "gpt_loss.png").stat().st_size > 0


def _exit_code(argv) -> int:
    try:
        return main(argv)
    except SystemExit as e:  # argparse's own usage errors
        return e.code


@pytest.mark.parametrize(
    "argv, message",
    [(["--hidden", "64", "--heads", "3"], "heads"), (["--prompt", ""], "--prompt"), (["--steps", "0"], "--steps")],
)
def test_gpt_command_usage_errors_are_one_line(argv, message, capsys, tmp_path):
    assert _exit_code(["gpt", *argv, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_evaluate_averages_every_token_but_the_first_once():
    """The validation loss averages the same N - 1 bytes the bigram does: windows overlap by one, the tail counts."""
    config = GPTConfig(vocab_size=9, context=4, hidden_size=8, num_layers=1, num_heads=2, intermediate_size=8)
    model = GPT(config, dtype=np.float64, rng=0, std=0.5)
    ids = np.random.default_rng(1).integers(0, 9, 11)  # windows [0:5], [4:9], [8:11]
    per_token = []
    for start in (0, 4, 8):
        w = ids[start : start + 5]
        z = model.logits(w[None, :-1])[0][0]  # (l, V)
        log_p = z - z.max(axis=-1, keepdims=True)
        log_p -= np.log(np.exp(log_p).sum(axis=-1, keepdims=True))
        per_token += list(-log_p[np.arange(len(w) - 1), w[1:]])
    assert len(per_token) == len(ids) - 1
    assert evaluate(model, ids, batch=2) == pytest.approx(np.mean(per_token), rel=1e-13)
