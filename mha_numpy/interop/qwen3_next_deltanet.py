"""Gated DeltaNet against transformers' ``Qwen3NextGatedDeltaNet``: the importer, the cast-lifted copy, the checks.

torch and transformers are imported lazily, inside the functions. The parameters (``recurrent.qwen3_next``):

==============  ===================  =========================================================
ours            Qwen3NextGatedDeltaNet   shape
==============  ===================  =========================================================
W_qkvz          in_proj_qkvz.weight  (2·Hk·dk + 2·Hv·dv, E), grouped by key head
W_ba            in_proj_ba.weight    (2·Hv, E)
conv_weight     conv1d.weight        ours (C, K), theirs (C, 1, K); C = 2·Hk·dk + Hv·dv
dt_bias, A_log  dt_bias, A_log       (Hv,)
norm_weight     norm.weight          (dv,)
W_out           out_proj.weight      (E, Hv·dv)
==============  ===================  =========================================================

The module casts to float32 inside whatever its dtype (measured: a float64 module gives float32-rounded outputs):
the gates (``A_log.float()``, ``a.float()``), the core (``torch_chunk_gated_delta_rule`` /
``torch_recurrent_gated_delta_rule`` cast q, k, v, g, β to float32) and ``Qwen3NextRMSNormGated`` (x̂ and silu(z) in
float32). ``deltanet_in_float64`` runs the module with a copy of its forward, line for line, with those casts
removed (the core from ``interop.gated_delta``'s lifted copies): the float64 check is against that copy, and the
as-shipped gap goes in the report's notes. The attention mask is transformers' (B, L) 0/1 padding mask, which
the module applies by zeroing the padding tokens' inputs (``apply_mask_to_padding_states``); ours takes it as bool.
"""

from __future__ import annotations

import types
from contextlib import contextmanager

import numpy as np

from ..recurrent.qwen3_next import DeltaNetState, GatedDeltaNet
from ._lazy import require, to_numpy
from .gated_delta import torch_chunk_gated_delta_rule_float64, torch_recurrent_gated_delta_rule_float64
from .harness import Row, compare, random_like, relative, tensor
from .report import CrosscheckReport, rtol_for

HF_QWEN3_NEXT_DELTANET_NAME_MAP = {
    "W_qkvz": "in_proj_qkvz.weight",
    "W_ba": "in_proj_ba.weight",
    "conv_weight": "conv1d.weight",
    "dt_bias": "dt_bias",
    "A_log": "A_log",
    "norm_weight": "norm.weight",
    "W_out": "out_proj.weight",
}
"""Our GatedDeltaNet's parameters -> Qwen3NextGatedDeltaNet's (conv1d.weight (C, 1, K) is ours (C, K))."""


def _ours(name: str, array) -> np.ndarray:
    a = np.array(to_numpy(array), copy=True)
    return a.reshape(a.shape[0], a.shape[-1]) if name == "conv_weight" else a  # (C, 1, K) -> (C, K)


def hf_qwen3_next_deltanet(
    hidden_size: int = 16,
    num_k_heads: int = 2,
    num_v_heads: int = 6,
    head_k_dim: int = 4,
    head_v_dim: int = 3,
    conv_kernel_size: int = 4,
    rms_norm_eps: float = 1e-6,
    dtype=np.float64,
    seed: int = 0,
):
    """A small random transformers ``Qwen3NextGatedDeltaNet`` (layer 0 of a tiny ``Qwen3NextConfig``).

    Weights N(0, 0.3²), the conv's N(0, 0.5²), the norm's N(1, 0.3²) (all ones would hide a swapped weight),
    dt_bias N(0, 0.5²), A_log N(0, 0.5²): decays e^g between about 0.2 and 1, so the state remembers a few tokens.
    """
    torch = require("torch")
    require("transformers")
    from transformers import Qwen3NextConfig
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextGatedDeltaNet

    cfg = Qwen3NextConfig(
        hidden_size=hidden_size, linear_num_key_heads=num_k_heads, linear_num_value_heads=num_v_heads,
        linear_key_head_dim=head_k_dim, linear_value_head_dim=head_v_dim, linear_conv_kernel_dim=conv_kernel_size,
        rms_norm_eps=rms_norm_eps, num_hidden_layers=1, vocab_size=16, intermediate_size=2 * hidden_size,
        num_attention_heads=2, num_key_value_heads=1, head_dim=8,
    )  # fmt: skip
    torch.manual_seed(seed)
    module = Qwen3NextGatedDeltaNet(cfg, layer_idx=0).to(getattr(torch, np.dtype(dtype).name))
    std = {"conv1d.weight": 0.5, "dt_bias": 0.5, "A_log": 0.5}
    with torch.no_grad():
        for name, p in module.named_parameters():
            p.normal_(1.0 if name == "norm.weight" else 0.0, std.get(name, 0.3))
    return module


def from_hf_qwen3_next_deltanet(module, chunk_size: int = 64, impl: str = "chunked") -> GatedDeltaNet:
    """transformers ``Qwen3NextGatedDeltaNet`` -> our ``GatedDeltaNet``, same weights (copied), same dtype."""
    named = dict(module.named_parameters())
    params = {ours: _ours(ours, named[theirs]) for ours, theirs in HF_QWEN3_NEXT_DELTANET_NAME_MAP.items()}
    if module.activation != "silu":
        raise ValueError(f"the module's activation is {module.activation!r}; GatedDeltaNet's conv uses silu")
    if module.conv1d.bias is not None:
        raise ValueError("the module's conv1d has a bias; GatedDeltaNet's conv has none (as Qwen3-Next's)")
    return GatedDeltaNet(
        module.hidden_size, module.num_k_heads, module.num_v_heads, module.head_k_dim, module.head_v_dim,
        module.conv_kernel_size, module.layer_norm_epsilon, params=params, dtype=params["W_out"].dtype,
        chunk_size=chunk_size, impl=impl,
    )  # fmt: skip


def _forward_without_casts(self, hidden_states, cache=None, attention_mask=None, **kwargs):
    """``Qwen3NextGatedDeltaNet.forward`` line for line, without its float32 casts (module docstring)."""
    torch = require("torch")
    from transformers.models.qwen3_next import modeling_qwen3_next as M

    hidden_states = M.apply_mask_to_padding_states(hidden_states, attention_mask)
    seq_len = hidden_states.shape[1]
    if cache is not None:
        conv_state = cache.get_conv_state(self.layer_idx, state_idx=0)
        recurrent_state = cache.get_recurrent_state(self.layer_idx, state_idx=0)
    else:
        conv_state, recurrent_state = None, None
    query, key, value, z, b, a = self.fix_query_key_value_ordering(self.in_proj_qkvz(hidden_states),
                                                                   self.in_proj_ba(hidden_states))  # fmt: skip
    query, key, value = (x.reshape(x.shape[0], x.shape[1], -1) for x in (query, key, value))
    mixed_qkv = torch.cat((query, key, value), dim=-1).transpose(1, 2)
    weight = self.conv1d.weight.squeeze(1)
    if conv_state is not None and seq_len == 1 and not cache.is_recording_past(self.layer_idx):
        mixed_qkv = M.causal_conv1d_update(mixed_qkv, conv_state, weight, self.conv1d.bias, self.activation)
    else:
        if cache is not None:
            mixed_qkv = cache.update_conv_state(mixed_qkv, self.layer_idx, conv_kernel_size=self.conv_kernel_size)
        mixed_qkv = M.causal_conv1d_fn(mixed_qkv, weight, self.conv1d.bias, activation=self.activation)
        if cache is not None:
            mixed_qkv = mixed_qkv[:, :, -seq_len:]
    query, key, value = torch.split(mixed_qkv.transpose(1, 2), [self.key_dim, self.key_dim, self.value_dim], dim=-1)
    query = query.reshape(query.shape[0], query.shape[1], -1, self.head_k_dim)
    key = key.reshape(key.shape[0], key.shape[1], -1, self.head_k_dim)
    value = value.reshape(value.shape[0], value.shape[1], -1, self.head_v_dim)
    beta = b.sigmoid()
    g = -self.A_log.exp() * torch.nn.functional.softplus(a + self.dt_bias)  # lifted: no .float()
    core = torch_recurrent_gated_delta_rule_float64 if recurrent_state is not None and seq_len == 1 else (
        torch_chunk_gated_delta_rule_float64)  # fmt: skip
    core_attn_out, last_recurrent_state = core(query, key, value, g=g, beta=beta, initial_state=recurrent_state,
                                               output_final_state=cache is not None,
                                               use_qk_l2norm_in_kernel=True)  # fmt: skip
    if cache is not None:
        cache.update_recurrent_state(last_recurrent_state, self.layer_idx)
    z_shape_og = z.shape
    core_attn_out = core_attn_out.reshape(-1, core_attn_out.shape[-1])
    z = z.reshape(-1, z.shape[-1])
    # Qwen3NextRMSNormGated without its float32 round trips
    variance = core_attn_out.pow(2).mean(-1, keepdim=True)
    normed = self.norm.weight * (core_attn_out * torch.rsqrt(variance + self.norm.variance_epsilon))
    core_attn_out = (normed * torch.nn.functional.silu(z)).reshape(z_shape_og)
    return self.out_proj(core_attn_out.reshape(core_attn_out.shape[0], core_attn_out.shape[1], -1))


@contextmanager
def deltanet_in_float64(module):
    """Within the block the module runs ``_forward_without_casts`` (its forward without the float32 casts);
    the class's forward again afterwards."""
    module.forward = types.MethodType(_forward_without_casts, module)
    try:
        yield module
    finally:
        del module.forward


def hf_cache(module):
    """A transformers cache for the module's layer (a ``DynamicCache`` from its config: a linear-attention layer)."""
    require("transformers")
    from transformers import DynamicCache, Qwen3NextConfig

    cfg = Qwen3NextConfig(num_hidden_layers=1, layer_types=["linear_attention"])
    return DynamicCache(config=cfg)


def run_hf(module, x, attention_mask, d_output, lifted: bool) -> dict:
    """The module on x (a fresh cache, to read the state after the call) and torch autograd of d_output ->
    {"output", "dx", "conv_state" (its last K-1 inputs, ours' layout), "recurrent_state", "grad NAME"}."""
    torch = require("torch")
    tx, named = tensor(torch, x, grad=True), dict(module.named_parameters())
    mask_t = None if attention_mask is None else tensor(torch, attention_mask.astype(np.int64))
    cache = hf_cache(module)
    with deltanet_in_float64(module) if lifted else _same(module):
        out = module(tx, cache=cache, attention_mask=mask_t)
    grads = torch.autograd.grad(out, [tx, *named.values()], tensor(torch, d_output))
    conv = cache.get_conv_state(0, state_idx=0)  # (B, C, K): its last K inputs
    K = module.conv_kernel_size
    res = {"output": out.detach().numpy(), "dx": grads[0].numpy(),
           "conv_state": conv[:, :, 1:].transpose(1, 2).detach().numpy() if K > 1 else None,
           "recurrent_state": cache.get_recurrent_state(0, state_idx=0).detach().numpy()}  # fmt: skip
    by_name = dict(zip(named, grads[1:]))
    res.update({f"grad {ours}": _ours(ours, by_name[t]) for ours, t in HF_QWEN3_NEXT_DELTANET_NAME_MAP.items()})
    return res


@contextmanager
def _same(module):
    yield module


def crosscheck_hf_qwen3_next_deltanet(
    module, hidden_states, attention_mask=None, d_output=None, rng=0, rtol=None, impl: str = "chunked",
    chunk_size: int = 64,
) -> CrosscheckReport:  # fmt: skip
    """A transformers ``Qwen3NextGatedDeltaNet`` against ``from_hf_qwen3_next_deltanet(module)``: output, the
    state after the call (conv and recurrent), dL/dx and every parameter's gradient by torch autograd.

    hidden_states (B, L, E); attention_mask (B, L) bool (True = a token) or None. float64: against the module with
    its casts lifted (``deltanet_in_float64``), default 1e-10, the as-shipped gap in a note; float32: against the
    module as shipped, default 1e-5.
    """
    ours_layer = from_hf_qwen3_next_deltanet(module, chunk_size=chunk_size, impl=impl)
    x = np.asarray(hidden_states)
    dtype = x.dtype
    rtol = rtol_for(dtype, rtol)
    d_out = random_like(x.shape, dtype, rng) if d_output is None else np.asarray(d_output, dtype=dtype)
    (y, state), cache = ours_layer.forward(x, attention_mask)
    g = ours_layer.backward(d_out, cache)
    ours = {"output": y, "dx": g["x"], "conv_state": state.conv, "recurrent_state": state.recurrent}
    ours.update({f"grad {name}": g[name] for name in GatedDeltaNet.PARAM_NAMES})
    lifted = dtype == np.float64
    theirs = run_hf(module, x, attention_mask, d_out, lifted)
    rows = [
        Row("output", "module(x)", "output"),
        Row("state: conv", "cache conv state [-(K-1):]", "conv_state"),
        Row("state: recurrent", "cache recurrent state", "recurrent_state"),
        Row("dL/dx", "autograd", "dx"),
    ]
    rows += [Row(f"dL/d{n}", f"{t}.grad", f"grad {n}") for n, t in HF_QWEN3_NEXT_DELTANET_NAME_MAP.items()]
    notes = []
    if lifted:
        shipped = run_hf(module, x, attention_mask, d_out, lifted=False)
        worst = max(relative(ours[k], shipped[k]) for k in shipped if k.startswith("grad "))
        notes.append(f"as shipped (float32 casts inside): output {relative(y, shipped['output']):.1e}, "
                     f"gradients up to {worst:.1e} from ours")  # fmt: skip
    title = (f"ours vs transformers Qwen3NextGatedDeltaNet (Hk={ours_layer.num_k_heads}, Hv={ours_layer.num_v_heads}, "
             f"dk={ours_layer.head_k_dim}, dv={ours_layer.head_v_dim}, K={ours_layer.conv_kernel_size}, {impl}"
             f"{', padding' if attention_mask is not None else ''})")  # fmt: skip
    return compare(title, dtype, rtol, rows, ours, theirs, notes)


def decode_hf_qwen3_next_deltanet(module, hidden_states, prefill: int = 3, lifted: bool = True):
    """transformers' decoding: a prefill of ``prefill`` tokens with a fresh cache, then one token a call ->
    (outputs (B, L, E), DeltaNetState after the last call in our layout), arrays."""
    torch = require("torch")
    x = np.asarray(hidden_states)
    cache, outs = hf_cache(module), []
    with torch.no_grad(), deltanet_in_float64(module) if lifted else _same(module):
        for a, b in [(0, prefill)] + [(t, t + 1) for t in range(prefill, x.shape[1])]:
            outs.append(module(tensor(torch, x[:, a:b]), cache=cache).numpy())
    conv = cache.get_conv_state(0, state_idx=0)[:, :, 1:].transpose(1, 2).numpy()  # (B, K-1, C)
    return np.concatenate(outs, axis=1), DeltaNetState(conv, cache.get_recurrent_state(0, state_idx=0).numpy())
