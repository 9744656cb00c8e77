"""Gemma 3n's cross-layer KV sharing against Hugging Face ``Gemma3nTextAttention``: the importer and a stack check.

torch and transformers are imported lazily, inside the functions. The last ``num_kv_shared_layers`` layers of
Gemma 3n make no K and V of their own: each reads those of the last earlier layer of its type (sliding or full),
``config.kv_sharing_modes`` ("store" for that layer, "reuse" for the readers). Every layer normalises V per head
without a weight (``v_norm``), and scales its scores by 1 (``scaling = 1.0``: the norms set their size).

======================  ==============================  ============================================
ours                    Gemma3nTextAttention            shape / value
======================  ==============================  ============================================
W_q, b_q, W_o, b_o      q_proj, o_proj                  every layer (biases with attention_bias)
W_k, b_k, W_v, b_v      k_proj, v_proj                  the layers that make their K and V
q_norm, k_norm          q_norm.weight, k_norm.weight    (d,), RMSNorm scaled by the weight (not 1 + w)
v_norm=True             v_norm                          RMSNorm without a weight, eps = rms_norm_eps
kv_sharing              kv_sharing_modes[layer_idx]     "store" / "reuse" / None (``kv_sharing.py``)
rope_theta              rope_parameters[layer_type]     the layer type's base, as Gemma 3
scale                   scaling                         1.0
======================  ==============================  ============================================

``crosscheck_hf_gemma3n_layers`` runs a whole stack of those layers on given inputs, HF's with its
``shared_kv_states`` dict and torch autograd of Σ_j <d_j, output_j>, ours with ``kv_sharing.shared_kv_forward`` /
``shared_kv_backward``: a source layer's gradients include what its readers send back. ``Gemma3nRMSNorm`` and the
eager softmax round through float32: the float64 check runs them in float64 and reports the as-shipped gap.
"""

from __future__ import annotations

import types
from contextlib import ExitStack, contextmanager

import numpy as np

from .._checks import as_generator
from ..attention import MultiHeadAttention
from ..kv_sharing import shared_kv_backward, shared_kv_forward
from ._lazy import require
from .convert import module_with_params, numpy_dtype_of
from .decoder_attention import hf_layer_mask, layer_mask, softmax_in_input_dtype
from .gemma3 import gemma3_layer_options
from .harness import Row, autograd, compare, eval_mode, grad_key, relative, tensor, theirs_grads, upstream
from .llama import torch_cos_sin
from .names import params_from_state
from .report import CrosscheckReport, rtol_for


def gemma3n_kv_sources(config) -> list[int]:
    """Each layer's source of K and V (``kv_sharing.check_kv_sources``' form): itself, or for a "reuse" layer the
    last earlier "store" layer of its type."""
    modes, kinds = config.kv_sharing_modes, config.layer_types
    stores = {kinds[i]: i for i, mode in enumerate(modes) if mode == "store"}
    return [stores[kinds[j]] if mode == "reuse" else j for j, mode in enumerate(modes)]


def gemma3n_name_map(module) -> dict:
    """Where each of our parameters lives in ``module`` (a reusing layer has no k/v_proj and no k_norm)."""
    names = ["W_q", "W_o", "q_norm"] + ([] if module.is_kv_shared_layer else ["W_k", "W_v", "k_norm"])
    if module.q_proj.bias is not None:
        names += [f"b_{n[-1]}" for n in names if n.startswith("W_")]
    torch_names = {"q_norm": "q_norm.weight", "k_norm": "k_norm.weight"}
    return {n: (torch_names.get(n, f"{n[-1]}_proj.{'weight' if n[0] == 'W' else 'bias'}"), None) for n in names}


def from_hf_gemma3n_attention(module) -> MultiHeadAttention:
    """Hugging Face ``Gemma3nTextAttention`` -> ``MultiHeadAttention(qk_norm=True, v_norm=True, scale=1.0,
    kv_sharing=..., rope_theta=its layer type's)``, same weights. A reusing layer is called with its source's K and V
    as key and value (``kv_sharing.shared_kv_forward``)."""
    cfg = module.config
    if {module.q_norm.eps} != {cfg.rms_norm_eps}:
        raise ValueError(f"q_norm's eps {module.q_norm.eps} is not config.rms_norm_eps={cfg.rms_norm_eps}")
    mode = cfg.kv_sharing_modes[module.layer_idx]
    bias, E = module.q_proj.bias is not None, module.q_proj.in_features
    params = params_from_state(dict(module.named_parameters()), gemma3n_name_map(module))
    eps = float(cfg.rms_norm_eps)
    return module_with_params(E, cfg.num_attention_heads, bias, E, E, float(cfg.attention_dropout),
                              numpy_dtype_of(module.q_proj.weight.dtype), params, num_kv_heads=cfg.num_key_value_heads,
                              head_dim=module.head_dim, scale=float(module.scaling), qk_norm=True, qk_norm_eps=eps,
                              v_norm=True, v_norm_eps=eps, kv_sharing=mode,
                              **gemma3_layer_options(cfg, module.layer_idx))  # fmt: skip


@contextmanager
def gemma3n_in_float64(torch, modules):
    """Within the block, every ``Gemma3nRMSNorm`` of ``modules`` in the input's dtype (no float32 round trip) and
    the eager softmax in float64. Restored afterwards."""

    def rms_norm(self, x):  # Gemma3nRMSNorm.forward without .float() and back
        return self._norm(x) * self.weight if self.with_scale else self._norm(x)

    norms = [getattr(m, n) for m in modules for n in ("q_norm", "k_norm", "v_norm") if hasattr(m, n)]
    for norm in norms:
        norm.forward = types.MethodType(rms_norm, norm)
    try:
        with softmax_in_input_dtype(torch):
            yield
    finally:
        for norm in norms:
            del norm.forward


def _hf_stack(torch, modules, xs, am, d_outputs, float64: bool) -> dict:
    """HF's layers in order with one ``shared_kv_states``, torch autograd of Σ <d_j, output_j> -> outputs, dx, and
    every layer's parameter gradients (keyed "j name")."""
    from transformers.cache_utils import KVSharingDict

    txs, shared, outs = [tensor(torch, x, grad=True) for x in xs], KVSharingDict(), []
    B, L, _ = xs[0].shape
    with ExitStack() as stack:
        for m in modules:
            stack.enter_context(eval_mode(m))
        if float64:
            stack.enter_context(gemma3n_in_float64(torch, modules))
        for m, tx in zip(modules, txs):
            theta = float(m.config.rope_parameters[m.layer_type]["rope_theta"])  # its type's, read from its config
            cos_sin = torch_cos_sin(torch, np.broadcast_to(np.arange(L), (B, L)), m.head_dim, theta, xs[0].dtype)
            outs.append(m(tx, cos_sin, hf_layer_mask(torch, m, tx, am), shared_kv_states=shared)[0])
        named = {f"{j} {n}": p for j, m in enumerate(modules) for n, p in m.named_parameters()}
        loss = sum((o * tensor(torch, d)).sum() for o, d in zip(outs, d_outputs))
        dxs, grads = autograd(torch, loss.reshape(1), txs, named, np.ones(1, xs[0].dtype))
    theirs = {f"output {j}": o.detach().numpy() for j, o in enumerate(outs)}
    theirs.update({f"dx {j}": dx for j, dx in enumerate(dxs)})
    for j, m in enumerate(modules):
        mine = {n: grads[f"{j} {n}"] for n, _ in m.named_parameters()}
        theirs.update({f"{j} {k}": v for k, v in theirs_grads(mine, gemma3n_name_map(m)).items()})
    return theirs


def _ours_stack(layers, modules, xs, am, d_outputs, sources) -> dict:
    """Our layers through ``kv_sharing``: outputs, the inputs' gradients and every parameter's, keyed as theirs."""
    B, L, _ = xs[0].shape
    masks = [layer_mask(B, L, L, m.sliding_window, am) for m in modules]
    outputs, caches = shared_kv_forward(layers, xs, sources, masks)
    grads = shared_kv_backward(layers, d_outputs, caches, sources)
    ours = {f"output {j}": o for j, o in enumerate(outputs)}
    for j, (g, i) in enumerate(zip(grads, sources)):
        ours[f"dx {j}"] = g["query"] + (g["key"] + g["value"] if i == j else 0)  # a reader's key is its source's K
        ours.update({f"{j} {grad_key(n)}": g[n] for n in layers[j].params})
    return ours


def _row_name(key: str) -> str:
    """ "output 0" -> "layer 0: output", "dx 0" -> "layer 0: dL/dx", "0 grad W_q" -> "layer 0: dL/dW_q"."""
    first, rest = key.split(" ", 1)
    if first in ("output", "dx"):
        return f"layer {rest}: {'output' if first == 'output' else 'dL/dx'}"
    return f"layer {first}: dL/d{rest.removeprefix('grad ')}"


def crosscheck_hf_gemma3n_layers(
    modules, hidden_states, attention_mask=None, d_outputs=None, rng=0, rtol=None, kernel=None
) -> CrosscheckReport:
    """A stack of transformers ``Gemma3nTextAttention`` layers (eager; one config, layers 0 ... n - 1), each on its
    own input, against ours (``from_hf_gemma3n_attention``, ``kv_sharing``) and torch autograd.

    hidden_states, d_outputs (None: random): one (B, L, E) array per layer; attention_mask (B, L) HF style or None.
    Rows: each layer's output, the gradient of each layer's input and of every layer's parameters (a source layer's
    include its readers')."""
    torch = require("torch")
    layers = [from_hf_gemma3n_attention(m) for m in modules]
    for layer in layers:
        layer.kernel = layer.kernel if kernel is None else kernel
    dtype, sources = layers[0].dtype, gemma3n_kv_sources(modules[0].config)[: len(modules)]
    xs = [np.asarray(x).astype(dtype, copy=False) for x in hidden_states]
    gen, given = as_generator(rng), [None] * len(xs) if d_outputs is None else d_outputs
    d_outputs = [upstream(d, x.shape, dtype, gen) for d, x in zip(given, xs)]  # one random upstream gradient a layer
    ours = _ours_stack(layers, modules, xs, attention_mask, d_outputs, sources)
    theirs = _hf_stack(torch, modules, xs, attention_mask, d_outputs, dtype == np.float64)
    rows = [Row(_row_name(key), "module(...)" if key.startswith("output") else "autograd", key) for key in ours]
    notes = [f"layer types {modules[0].config.layer_types[: len(modules)]}; kernel {layers[0].impl}"]
    if dtype == np.float64:
        shipped = _hf_stack(torch, modules, xs, attention_mask, d_outputs, False)
        gap = max(relative(ours[k], shipped[k]) for k in ours if k.startswith("output"))
        notes.append(f"HF run with its RMSNorms and softmax in float64; as shipped it differs by {gap:.1e} (outputs)")
    title = f"ours vs transformers Gemma3nTextAttention: {len(modules)} layers sharing K and V, sources {sources}"
    return compare(title, dtype, rtol_for(dtype, rtol), rows, ours, theirs, notes)


def hf_gemma3n_layers(hidden_size, num_heads, num_kv_heads, head_dim, num_layers=4, num_kv_shared_layers=2,
                      sliding_window=3, bias=True, dtype=np.float64, seed=0, init_std=0.5):  # fmt: skip
    """Small random ``Gemma3nTextAttention`` layers 0 ... num_layers - 1 of one config (eager), sliding and full in
    turn, the last ``num_kv_shared_layers`` reading the K and V of the last earlier layer of their type; bases 10
    (sliding) and 1000 (full). Weights N(0, init_std²), norm weights N(1, 0.3²), biases N(0, 0.1²)."""
    torch = require("torch")
    require("transformers")
    from transformers import Gemma3nTextConfig
    from transformers.models.gemma3n.modeling_gemma3n import Gemma3nTextAttention

    kinds = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(num_layers)]
    rope = {"sliding_attention": {"rope_type": "default", "rope_theta": 10.0},
            "full_attention": {"rope_type": "default", "rope_theta": 1000.0}}  # fmt: skip
    cfg = Gemma3nTextConfig(
        hidden_size=hidden_size, num_attention_heads=num_heads, num_key_value_heads=num_kv_heads, head_dim=head_dim,
        num_hidden_layers=num_layers, layer_types=kinds, num_kv_shared_layers=num_kv_shared_layers,
        sliding_window=sliding_window, rope_parameters=rope, attention_bias=bias, vocab_size=16,
        vocab_size_per_layer_input=16, intermediate_size=2 * hidden_size, hidden_size_per_layer_input=4,
        laurel_rank=2, attn_implementation="eager",
    )  # fmt: skip
    torch.manual_seed(seed)
    modules = [Gemma3nTextAttention(cfg, i).to(getattr(torch, np.dtype(dtype).name)) for i in range(num_layers)]
    with torch.no_grad():
        for name, p in (item for m in modules for item in m.named_parameters()):
            p.normal_(1.0 if "norm" in name else 0.0, 0.3 if "norm" in name else (0.1 if "bias" in name else init_std))
    return modules
