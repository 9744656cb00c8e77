"""BERT's encoder layer as a configuration of the generic ``Block``: its checkpoint names and dropout sites as data.

    a = MHA(x, x, x)                 attention.self.{query,key,value}, attention.output.dense
    h = LN1(x + drop(a))             attention.output.LayerNorm
    f = W_2 gelu(W_1 h + b_1) + b_2  intermediate.dense, output.dense (GELU as config.hidden_act says)
    y = LN2(h + drop(f))             output.LayerNorm

Post-norm as BERT was trained; ``norm="pre"`` moves both LayerNorms before their sublayers (models/block.py has
both columns). The tiny model's block uses the same names under 'block.'.
"""

from __future__ import annotations

import numpy as np

from ..attention import MultiHeadAttention
from .block import Block

# the block's role -> the checkpoint name inside a BERT layer (PyTorch layout on both sides)
BERT_NAMES = {
    "W_q": "attention.self.query.weight",
    "b_q": "attention.self.query.bias",
    "W_k": "attention.self.key.weight",
    "b_k": "attention.self.key.bias",
    "W_v": "attention.self.value.weight",
    "b_v": "attention.self.value.bias",
    "W_o": "attention.output.dense.weight",
    "b_o": "attention.output.dense.bias",
    "norm1.weight": "attention.output.LayerNorm.weight",
    "norm1.bias": "attention.output.LayerNorm.bias",
    "W_1": "intermediate.dense.weight",
    "b_1": "intermediate.dense.bias",
    "W_2": "output.dense.weight",
    "b_2": "output.dense.bias",
    "norm2.weight": "output.LayerNorm.weight",
    "norm2.bias": "output.LayerNorm.bias",
}
# config.hidden_act -> GELU's ``approximate``: transformers' "gelu" is the exact erf form, "gelu_new" and
# "gelu_pytorch_tanh" are the tanh form (GPT-2's), the same formula
GELU_OF_HIDDEN_ACT = {"gelu": "none", "gelu_new": "tanh", "gelu_pytorch_tanh": "tanh"}
# the block's dropout role -> the site's name in BERT (the module whose output is dropped, as in transformers)
DROPOUT_SITES = {"attention": "attention.self", "attention_output": "attention.output", "ffn_output": "output"}


def bert_layer(config, params: dict[str, np.ndarray], prefix: str, dtype, norm: str = "post") -> Block:
    """One BERT layer reading ``params`` under ``prefix`` (e.g. 'encoder.layer.0.'): our MultiHeadAttention with
    biases and the attention dropout, LayerNorms with ``config.layer_norm_eps``, the GELU MLP (exact or tanh, from
    ``config.hidden_act``), and ``config.hidden_dropout_prob`` on both residual branches. ``norm``: "post" (BERT)
    or "pre"."""
    if config.hidden_act not in GELU_OF_HIDDEN_ACT:
        raise ValueError(f"hidden_act={config.hidden_act!r} is not built; one of {sorted(GELU_OF_HIDDEN_ACT)}")
    E, H = config.hidden_size, config.num_attention_heads
    attention = MultiHeadAttention(E, H, bias=True, dropout=config.attention_probs_dropout_prob, dtype=dtype, rng=0)
    return Block(attention, params, BERT_NAMES, prefix, norm_position=norm, norm="layer_norm",
                 eps=config.layer_norm_eps, ffn="gelu", approximate=GELU_OF_HIDDEN_ACT[config.hidden_act],
                 dropout=config.hidden_dropout_prob)  # fmt: skip
