"""The NumPy BERT under the name users type: ``from mha_numpy.bert import BertModel``.

A plain re-export: the model is ``mha_numpy.models.bert`` (``BertModel``, its config, output and cache, the
weights a config needs), its layers are configurations of ``models.block``, and the files it reads are
``models.bert_files`` (the tokenizer, the tokenized inputs, where the weights package puts its files). Import
from here; read the code there.
"""

from .models.bert import BertCache, BertConfig, BertModel, BertOutput, expected_shapes
from .models.bert_files import BertInputs, BertTokenizer, default_model_dir

__all__ = [
    "BertModel",
    "BertConfig",
    "BertOutput",
    "BertCache",
    "BertInputs",
    "BertTokenizer",
    "default_model_dir",
    "expected_shapes",
]
