"""Which torch tensor holds which of our parameters: plain data, readable and testable without torch."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ._lazy import to_numpy

# our name -> (torch state-dict name, rows of that tensor or None for all of it)
NameMap = dict[str, tuple[str, slice | None]]

HF_BERT_NAME_MAP: NameMap = {
    "W_q": ("self.query.weight", None),
    "W_k": ("self.key.weight", None),
    "W_v": ("self.value.weight", None),
    "W_o": ("output.dense.weight", None),
    "b_q": ("self.query.bias", None),
    "b_k": ("self.key.bias", None),
    "b_v": ("self.value.bias", None),
    "b_o": ("output.dense.bias", None),
}
"""BertAttention's parameters as ours. output.LayerNorm is *not* part of multi-head attention."""


def torch_mha_name_map(embed_dim: int, packed: bool = True, bias: bool = True, bias_kv: bool = False) -> NameMap:
    """Where each of our parameters lives in a ``torch.nn.MultiheadAttention`` state dict.

    packed (kdim == vdim == embed_dim): W_q, W_k, W_v are the row blocks [0:E], [E:2E], [2E:3E] of
    ``in_proj_weight`` (3E, E). Otherwise they are ``q_proj_weight`` (E, E), ``k_proj_weight`` (E, kdim),
    ``v_proj_weight`` (E, vdim). The input biases are always the blocks of ``in_proj_bias`` (3E,).
    bias_kv (``add_bias_kv=True``): our bias_k, bias_v (E,) are torch's ``bias_k``, ``bias_v`` (1, 1, E).
    """
    E = embed_dim
    rows = {"q": slice(0, E), "k": slice(E, 2 * E), "v": slice(2 * E, 3 * E)}
    name_map: NameMap = {}
    for x in "qkv":
        name_map[f"W_{x}"] = ("in_proj_weight", rows[x]) if packed else (f"{x}_proj_weight", None)
    name_map["W_o"] = ("out_proj.weight", None)
    if bias:
        for x in "qkv":
            name_map[f"b_{x}"] = ("in_proj_bias", rows[x])
        name_map["b_o"] = ("out_proj.bias", None)
    if bias_kv:
        name_map["bias_k"], name_map["bias_v"] = ("bias_k", None), ("bias_v", None)
    return name_map


def describe(entry: tuple[str, slice | None]) -> str:
    """("in_proj_weight", slice(8, 16)) -> "in_proj_weight[8:16]" (for tables)."""
    name, rows = entry
    return name if rows is None else f"{name}[{rows.start}:{rows.stop}]"


def params_from_state(state: Mapping, name_map: NameMap) -> dict[str, np.ndarray]:
    """Pick our parameters (or their gradients) out of a torch-named dict of tensors or arrays.

    ``state`` maps torch names to tensors/arrays (e.g. ``module.state_dict()``, or the gradients by
    parameter name); the result maps our names to NumPy copies, dtype unchanged.
    """
    out = {}
    for ours, (torch_name, rows) in name_map.items():
        if torch_name not in state:
            raise KeyError(f"{torch_name!r} (our {ours}) is missing; got {sorted(state)}")
        full = to_numpy(state[torch_name])
        out[ours] = np.array(full if rows is None else full[rows], copy=True)
        if ours in ("bias_k", "bias_v"):
            out[ours] = out[ours].reshape(-1)  # torch's (1, 1, E) -> our (E,)
    return out


HF_LLAMA_NAME_MAP: NameMap = {
    "W_q": ("q_proj.weight", None),
    "W_k": ("k_proj.weight", None),
    "W_v": ("v_proj.weight", None),
    "W_o": ("o_proj.weight", None),
    "b_q": ("q_proj.bias", None),
    "b_k": ("k_proj.bias", None),
    "b_v": ("v_proj.bias", None),
    "b_o": ("o_proj.bias", None),
}
"""LlamaAttention's parameters as ours (the biases exist only with ``attention_bias=True``)."""
