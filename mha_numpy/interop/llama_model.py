"""A whole transformers ``LlamaModel`` against our ``DecoderModel``: the importer and the cross-check.

    from mha_numpy.interop.llama_model import crosscheck_hf_llama_model, from_hf_llama_model, hf_llama_model
    hf = hf_llama_model(dtype=np.float64)                 # a tiny random LlamaModel, nothing downloaded
    ours = from_hf_llama_model(hf)                        # DecoderModel, the same weights by state-dict name
    print(crosscheck_hf_llama_model(hf, input_ids, attention_mask))

Our parameter names are LlamaModel's state-dict names (``models.decoder.LLAMA_NAMES`` for a layer), so the importer
is a copy by name. torch and transformers are imported lazily, inside the functions.

LlamaModel computes three steps in float32 whatever its dtype: ``LlamaRMSNorm`` (it upcasts to float32 and casts
back), ``LlamaRotaryEmbedding`` (float32 angles) and the eager attention's softmax (``dtype=torch.float32``). In
float64 that costs ~1e-7 relative, far above the 1e-10 a float64 check should reach, so the float64 cross-check
runs HF's model with those three steps in float64 (``float64_throughout``: its RMSNorm formula without the round
trip, the angles from the same formula in float64, HF's own SDPA attention instead of eager) and reports how far
the model as shipped is, in a note. In float32 the model runs exactly as given.
"""

from __future__ import annotations

import types
from contextlib import contextmanager
from typing import TYPE_CHECKING

import numpy as np

from ..models.decoder import DecoderConfig, DecoderModel
from ._lazy import require, to_numpy
from .harness import Row, compare, eval_mode, named_grad_rows, our_grads, shipped_gap, upstream
from .llama import hf_rope_theta, torch_cos_sin
from .report import CrosscheckReport, rtol_for

if TYPE_CHECKING:  # annotations only
    from transformers import LlamaConfig, LlamaModel


def decoder_config_from_hf(config: LlamaConfig) -> DecoderConfig:
    """A transformers ``LlamaConfig`` -> ``DecoderConfig``; ValueError for what the decoder does not model."""
    E, H = config.hidden_size, config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or E // H
    refused = {
        "attention_bias": bool(getattr(config, "attention_bias", False)),
        "mlp_bias": bool(getattr(config, "mlp_bias", False)),
        f"hidden_act={config.hidden_act!r}": config.hidden_act != "silu",
        f"head_dim={head_dim} with hidden_size / num_attention_heads = {E / H:g}": head_dim * H != E,
        "pretraining_tp > 1": getattr(config, "pretraining_tp", 1) > 1,
    }
    bad = [what for what, is_bad in refused.items() if is_bad]
    if bad:
        raise ValueError(f"the LlamaConfig has {', '.join(bad)}: not modelled by DecoderModel")
    return DecoderConfig(
        vocab_size=config.vocab_size,
        hidden_size=E,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=H,
        num_key_value_heads=config.num_key_value_heads,
        intermediate_size=config.intermediate_size,
        rms_norm_eps=float(config.rms_norm_eps),
        rope_theta=hf_rope_theta(config),  # refuses a rescaled RoPE (rope_type other than "default")
        pad_token_id=config.pad_token_id,
    )


def from_hf_llama_state_dict(state_dict, config: LlamaConfig, dtype=None) -> DecoderModel:
    """A LlamaModel (or LlamaForCausalLM, its 'model.' prefix dropped) state dict and its config -> DecoderModel.

    Tensors or arrays; copied. dtype: float32 or float64 (default: the embedding table's). Other entries
    (``lm_head.weight``) are not used.
    """
    state = {name.removeprefix("model."): to_numpy(t) for name, t in state_dict.items()}
    if "embed_tokens.weight" not in state:
        raise ValueError(f"the state dict has no embed_tokens.weight (not a LlamaModel's?), got {sorted(state)[:5]}")
    dtype = state["embed_tokens.weight"].dtype if dtype is None else dtype
    return DecoderModel(decoder_config_from_hf(config), state, dtype=dtype)


def from_hf_llama_model(model: LlamaModel) -> DecoderModel:
    """A transformers ``LlamaModel`` (or ``LlamaForCausalLM``: its ``.model``) -> DecoderModel, same weights."""
    model = getattr(model, "model", model)
    if not hasattr(model, "embed_tokens") or not hasattr(model, "config"):
        raise ValueError(f"model must be a transformers LlamaModel, got {type(model).__name__}")
    return from_hf_llama_state_dict(model.state_dict(), model.config)


def hf_llama_model(
    vocab_size: int = 32,
    hidden_size: int = 16,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 24,
    rope_theta: float = 10000.0,
    dtype=np.float64,
    seed: int = 0,
    attn_implementation: str = "eager",
    init_std: float = 0.3,
) -> LlamaModel:
    """A small random transformers ``LlamaModel`` in eval mode for the cross-checks. Weights N(0, init_std²) (large
    enough for peaked attention) and norm gains N(1, 0.2²) (all ones would hide a swapped weight)."""
    torch = require("torch")
    transformers = require("transformers")
    config = transformers.LlamaConfig(
        vocab_size=vocab_size, hidden_size=hidden_size, num_hidden_layers=num_layers, num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads, intermediate_size=intermediate_size, rope_theta=rope_theta,
        initializer_range=init_std, attn_implementation=attn_implementation,
    )  # fmt: skip
    torch.manual_seed(seed)
    model = transformers.LlamaModel(config).to(getattr(torch, np.dtype(dtype).name)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.normal_(1.0, 0.2)
    return model


@contextmanager
def float64_throughout(model: LlamaModel):
    """Within the block, ``model`` computes its RMSNorms, RoPE angles and attention in its own dtype (float64)
    instead of float32: each ``LlamaRMSNorm`` runs its formula without the float32 round trip, the rotary module
    builds (cos, sin) in float64 (``torch_cos_sin``), the attention is HF's SDPA. Restored afterwards."""
    torch = require("torch")

    def rms_norm(self, x):  # LlamaRMSNorm.forward without .to(torch.float32) and back
        variance = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(variance + self.variance_epsilon))

    head_dim = model.config.hidden_size // model.config.num_attention_heads
    theta = hf_rope_theta(model.config)

    def rotary(self, x, position_ids):  # LlamaRotaryEmbedding.forward with float64 angles, cast to x's dtype
        dtype = np.dtype(str(x.dtype).removeprefix("torch."))
        return torch_cos_sin(torch, position_ids.numpy(), head_dim, theta, dtype)  # (B, L, d) each

    norms = [m for m in model.modules() if type(m).__name__ == "LlamaRMSNorm"]
    implementation = model.config._attn_implementation
    for m in norms:
        m.forward = types.MethodType(rms_norm, m)
    model.rotary_emb.forward = types.MethodType(rotary, model.rotary_emb)
    model.set_attn_implementation("sdpa")
    try:
        yield model
    finally:
        for m in (*norms, model.rotary_emb):
            del m.forward  # the class's forward again
        model.set_attn_implementation(implementation)


def _run_hf(torch, model, ids, attention_mask, d) -> dict:
    """The LlamaModel on ``ids`` and autograd of <d, last_hidden_state> -> "hidden i" (the embeddings, then every
    layer's output, through forward hooks), "last" (last_hidden_state) and the gradients by name."""
    layer_outputs = []
    hooks = [layer.register_forward_hook(lambda m, i, out: layer_outputs.append(out)) for layer in model.layers]
    model.zero_grad(set_to_none=True)
    try:
        mask = None if attention_mask is None else torch.from_numpy(np.asarray(attention_mask))
        r = model(torch.from_numpy(ids), attention_mask=mask, output_hidden_states=True)
        r.last_hidden_state.backward(torch.from_numpy(d))
    finally:
        for h in hooks:
            h.remove()
    hidden = [r.hidden_states[0], *layer_outputs]
    theirs = {f"hidden {i}": h.detach().numpy() for i, h in enumerate(hidden)}
    theirs["last"] = r.last_hidden_state.detach().numpy()
    return {**theirs, **our_grads({name: p.grad.numpy() for name, p in model.named_parameters()})}


def _hf_runs(torch, model, ids, attention_mask, d) -> tuple[dict, dict]:
    """(the model as shipped, the compared run: in float64 inside ``float64_throughout``, in float32 as shipped),
    each ``_run_hf`` in eval mode."""
    with eval_mode(model):
        shipped = _run_hf(torch, model, ids, attention_mask, d)
        if d.dtype != np.float64:
            return shipped, shipped
        with float64_throughout(model):
            return shipped, _run_hf(torch, model, ids, attention_mask, d)


def crosscheck_hf_llama_model(
    model: LlamaModel,
    input_ids: np.ndarray,
    attention_mask: np.ndarray | None = None,
    d_last_hidden_state: np.ndarray | None = None,
    rng: int | np.random.Generator | None = 0,
    rtol: float | None = None,
) -> CrosscheckReport:
    """``from_hf_llama_model(model)`` against the transformers ``LlamaModel`` and torch autograd.

    input_ids (B, L) ints; attention_mask (B, L) Hugging Face style, 1 = keep (default none). Rows: the embeddings
    and every layer's output (HF's through forward hooks), last_hidden_state, and the gradient of every parameter
    for a random upstream gradient on last_hidden_state (``d_last_hidden_state``, default standard normal from
    ``rng``). Default pass threshold 1e-10 in float64 (HF's float32 steps switched off, module docstring), 1e-5 in
    float32 (the model as given).
    """
    torch = require("torch")
    ours_model = from_hf_llama_model(model)
    ids, dtype, c = np.asarray(input_ids), ours_model.dtype, ours_model.config
    out, cache = ours_model.forward(ids, attention_mask)
    d = upstream(d_last_hidden_state, out.last_hidden_state.shape, dtype, rng)
    grads = ours_model.backward(d, cache)
    ours = {**{f"hidden {i}": h for i, h in enumerate(out.hidden_states)}, "last": out.last_hidden_state}
    ours.update(our_grads(grads))
    shipped, theirs = _hf_runs(torch, model, ids, attention_mask, d)
    title = (f"DecoderModel ({c.num_hidden_layers} layers, H={c.num_attention_heads}, Hkv={c.num_key_value_heads}) "
             "vs transformers LlamaModel + autograd")  # fmt: skip
    real = ids.size if attention_mask is None else int(np.sum(attention_mask))
    notes = [f"batch {ids.shape[0]} x {ids.shape[1]} tokens ({real} real), random upstream gradient; "
             f"{len(ours_model.params)} tensors"]  # fmt: skip
    if dtype == np.float64:
        err_y, err_g = shipped_gap(ours, shipped, "last", grads)
        notes.append(
            f"HF run with its RMSNorm, RoPE angles and attention in float64 (float64_throughout, SDPA); the model as "
            f"shipped ({model.config._attn_implementation}, those three in float32) differs from ours by "
            f"{err_y:.1e} (last_hidden_state) and {err_g:.1e} (worst gradient), relative to the largest"
        )
    return compare(
        title, dtype, rtol_for(dtype, rtol), _rows(c.num_hidden_layers, ours_model.params), ours, theirs, notes
    )


def _rows(num_layers: int, params) -> tuple[Row, ...]:
    """The embeddings, every layer's output, last_hidden_state, the gradient of every parameter."""
    return (
        Row("embeddings", "hidden_states[0]", "hidden 0"),
        *(Row(f"layer {i} output", f"layers[{i}] forward hook", f"hidden {i + 1}") for i in range(num_layers)),
        Row("last_hidden_state", "LlamaModel(...).last_hidden_state", "last"),
        *named_grad_rows(params),
    )
