"""The hybrid decoder (``models.hybrid.HybridModel``) against a torch twin built from transformers' layers, under
torch autograd.

The twin is the same model, layer for layer, with the same parameter names:

    embed_tokens               torch.nn.Embedding
    layers.{i}, full_attention   transformers ``LlamaDecoderLayer`` (pre-norm RMSNorm, LlamaAttention, LlamaMLP), SDPA
    layers.{i}, linear_attention the same residual frame around transformers ``Qwen3NextGatedDeltaNet`` (linear_attn)
                                 with ``LlamaRMSNorm`` and ``LlamaMLP``
    layers.{i}, mamba            the same frame around transformers ``Mamba2Mixer`` (mamba)
    norm, lm_head              ``LlamaRMSNorm``, torch.nn.Linear (no bias)

transformers computes some steps in float32 inside a float64 module; the twin runs them in float64 (the float64
check is of the formulas, not of float32 rounding): ``LlamaRMSNorm`` without its float32 round trip, RoPE's
(cos, sin) from torch ops in float64 (``llama.torch_cos_sin``), the attention by SDPA (eager's softmax is float32),
``Qwen3NextGatedDeltaNet`` through ``qwen3_next_deltanet.deltanet_in_float64`` and ``Mamba2Mixer`` through
``mamba2.mamba2_in_float64`` (each its forward line for line without the casts). torch and transformers are
imported lazily.
"""

from __future__ import annotations

import types
from contextlib import ExitStack

import numpy as np

from ..models.hybrid import HybridModel
from ._lazy import require
from .harness import Row, compare, named_grad_rows, our_grads, upstream
from .llama import torch_cos_sin
from .mamba2 import mamba2_in_float64
from .qwen3_next_deltanet import deltanet_in_float64
from .report import CrosscheckReport, rtol_for


def _configs(model: HybridModel):
    """(a LlamaConfig, a Qwen3NextConfig) with the hybrid's sizes, for transformers' layers."""
    transformers = require("transformers")
    c = model.config
    head_dim = c.head_dim or c.hidden_size // c.num_attention_heads
    common = dict(vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
                  num_hidden_layers=c.num_hidden_layers, num_attention_heads=c.num_attention_heads,
                  num_key_value_heads=c.num_key_value_heads, head_dim=head_dim,
                  rms_norm_eps=c.rms_norm_eps)  # fmt: skip
    llama = transformers.LlamaConfig(**common, rope_theta=c.rope_theta, attn_implementation="sdpa")
    qwen = transformers.Qwen3NextConfig(
        **common, linear_num_key_heads=c.linear_num_key_heads, linear_num_value_heads=c.linear_num_value_heads,
        linear_key_head_dim=c.linear_key_head_dim, linear_value_head_dim=c.linear_value_head_dim,
        linear_conv_kernel_dim=c.linear_conv_kernel_dim,
    )  # fmt: skip
    mamba = None
    if "mamba" in c.layer_types:
        d_head = c.mamba_d_head or c.mamba_expand * c.hidden_size // c.mamba_n_heads
        if (c.mamba_n_heads * d_head) % c.hidden_size:
            raise ValueError(f"mamba_n_heads · mamba_d_head = {c.mamba_n_heads * d_head} must be a multiple of "
                             f"hidden_size = {c.hidden_size} for transformers' Mamba2Config (its expand)")  # fmt: skip
        mamba = transformers.Mamba2Config(
            hidden_size=c.hidden_size, num_heads=c.mamba_n_heads, head_dim=d_head, state_size=c.mamba_d_state,
            n_groups=c.mamba_n_groups, expand=c.mamba_n_heads * d_head // c.hidden_size, conv_kernel=c.mamba_d_conv,
            chunk_size=c.chunk_size, layer_norm_epsilon=c.rms_norm_eps, num_hidden_layers=c.num_hidden_layers,
            vocab_size=c.vocab_size,
        )  # fmt: skip
    return llama, qwen, mamba


def hf_hybrid_twin(model: HybridModel):
    """A torch module of the hybrid built from transformers' layers (module docstring), with ``model``'s weights
    (copied), in its dtype. Called as ``twin(input_ids)`` -> logits; run it inside ``float64_twin(twin)``."""
    torch = require("torch")
    require("transformers")
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaMLP, LlamaRMSNorm
    from transformers.models.mamba2.modeling_mamba2 import Mamba2Mixer
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextGatedDeltaNet

    llama, qwen, mamba = _configs(model)
    c = model.config
    nn = torch.nn

    class MixerLayer(nn.Module):  # LlamaDecoderLayer's frame with a recurrent token mixer named ``name``
        def __init__(self, name, mixer):
            super().__init__()
            self.name = name
            self.input_layernorm = LlamaRMSNorm(c.hidden_size, eps=c.rms_norm_eps)
            setattr(self, name, mixer)
            self.post_attention_layernorm = LlamaRMSNorm(c.hidden_size, eps=c.rms_norm_eps)
            self.mlp = LlamaMLP(llama)

        def forward(self, x, position_embeddings):
            x = x + getattr(self, self.name)(self.input_layernorm(x))
            return x + self.mlp(self.post_attention_layernorm(x))

    def layer(i, kind):
        if kind == "full_attention":
            return LlamaDecoderLayer(llama, layer_idx=i)
        if kind == "linear_attention":
            return MixerLayer("linear_attn", Qwen3NextGatedDeltaNet(qwen, layer_idx=i))
        if kind == "mamba":
            return MixerLayer("mamba", Mamba2Mixer(mamba, layer_idx=i))
        raise ValueError(f"layer_types[{i}] = {kind!r} has no torch twin here")

    class Twin(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
            self.layers = nn.ModuleList(layer(i, kind) for i, kind in enumerate(c.layer_types))
            self.norm = LlamaRMSNorm(c.hidden_size, eps=c.rms_norm_eps)
            self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)

        def forward(self, input_ids):
            B, L = input_ids.shape
            x = self.embed_tokens(input_ids)
            cos_sin = torch_cos_sin(torch, np.broadcast_to(np.arange(L), (B, L)), llama.head_dim, c.rope_theta,
                                    model.dtype)  # fmt: skip
            for layer in self.layers:
                x = layer(x, position_embeddings=cos_sin)  # LlamaDecoderLayer: no mask and SDPA = causal
            return self.lm_head(self.norm(x))

    twin = Twin().to(getattr(torch, model.dtype.name)).eval()
    with torch.no_grad():
        for name, p in twin.named_parameters():
            p.copy_(torch.from_numpy(model.params[name].reshape(p.shape)))  # conv1d.weight: ours (C, K)
    return twin


def float64_twin(twin) -> ExitStack:
    """A context in which ``twin`` computes its RMSNorms and recurrent layers in its own dtype (module
    docstring); the classes' forwards again afterwards."""
    torch = require("torch")

    def rms_norm(self, x):  # LlamaRMSNorm.forward without .to(torch.float32) and back
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))

    stack = ExitStack()
    for m in twin.modules():
        if type(m).__name__ == "LlamaRMSNorm":
            m.forward = types.MethodType(rms_norm, m)
            stack.callback(delattr, m, "forward")
        elif type(m).__name__ == "Qwen3NextGatedDeltaNet":
            stack.enter_context(deltanet_in_float64(m))
        elif type(m).__name__ == "Mamba2Mixer":
            stack.enter_context(mamba2_in_float64(m))
    return stack


def crosscheck_hf_hybrid(
    model: HybridModel, input_ids: np.ndarray, d_logits: np.ndarray | None = None, rng=0, rtol: float | None = None
) -> CrosscheckReport:
    """``model`` against its twin (``hf_hybrid_twin``) under torch autograd: the logits and the gradient of every
    parameter for a random upstream gradient on the logits (``d_logits``, default standard normal from ``rng``).
    Pass threshold 1e-10 in float64, 1e-5 in float32 (the twin's float32 steps left as shipped)."""
    torch = require("torch")
    ids = np.asarray(input_ids)
    logits, cache = model.forward(ids)
    d = upstream(d_logits, logits.shape, model.dtype, rng)
    ours = {"logits": logits, **our_grads(model.backward(d, cache))}
    twin = hf_hybrid_twin(model)
    with float64_twin(twin) if model.dtype == np.float64 else ExitStack():
        out = twin(torch.from_numpy(ids))
        out.backward(torch.from_numpy(d))
    theirs = {"logits": out.detach().numpy()}
    theirs.update(our_grads({n: p.grad.numpy().reshape(model.params[n].shape) for n, p in twin.named_parameters()}))
    rows = (Row("logits", "twin(input_ids)", "logits"), *named_grad_rows(model.params))
    notes = [f"layer_types {list(model.config.layer_types)}; batch {ids.shape[0]} x {ids.shape[1]} tokens, random "
             f"upstream gradient; {len(model.params)} tensors"]  # fmt: skip
    return compare(f"{model!r} vs its transformers twin + autograd", model.dtype, rtol_for(model.dtype, rtol), rows,
                   ours, theirs, notes)  # fmt: skip
