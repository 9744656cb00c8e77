"""The capstone's GPT: the corpus and its split, the byte tokenizer, the bigram baseline against a hand count, the
model's gradients against central differences, and ``python -m mha_numpy gpt`` run small (it must beat the bigram)."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from mha_numpy.data import corpus as C


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
