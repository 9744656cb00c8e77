"""Mamba-2 against transformers' ``Mamba2Mixer``: the SSD functions and the forward with their float32 casts lifted,
the importer, the checks.

transformers (``transformers.models.mamba2.modeling_mamba2``) computes the scan in float32 whatever the module's
dtype: ``mamba2_chunk_scan`` casts x, B, C, dt (``.float()``), ``mamba2_selective_state_update`` (one token of
decoding) the decay ``exp(dt.float() * A.float())``, ``Mamba2Mixer.forward`` takes ``A = −exp(A_log.float())``, and
``MambaRMSNormGated`` normalises in float32. The copies below are their torch fallbacks line for line with those casts
removed, so the float64 check runs in float64 (as ``interop.qwen3_next_deltanet`` lifts Qwen3-Next's); the float32
check is against the module as shipped. Other changes: none but the dtype.

Noticed (transformers 5.24): the one-token path (``mamba2_selective_state_update``) does not clamp the time step to
``time_step_limit``, the chunked path does; with a limit that binds, its decoding differs from its own full forward
(measured: 1.6 at the tokens after the prefill). Ours clamps in both (``recurrent.gates.time_step_forward``); the
default limit (0, inf) never binds, and the decoding cross-check uses it.

Layouts: theirs (B, L, H, P), B and C (B, L, G, N), the state (B, H, P, N); ours (B, H, L, P), (B, G, L, N),
(B, H, N, P) (``recurrent.ssd``). The parameters (``recurrent.mamba2``):

============  ================  ==================================================================
ours          Mamba2Mixer       shape
============  ================  ==================================================================
W_in          in_proj.weight    (I + C + H, E): [z (I) | x B C (C = I + 2·G·N) | dt (H)]
conv_weight   conv1d.weight     ours (C, K), theirs (C, 1, K)
conv_bias     conv1d.bias       (C,)
dt_bias       dt_bias           (H,)
A_log         A_log             (H,)
D             D                 (H,)
norm_weight   norm.weight       (I,)
W_out         out_proj.weight   (E, I)
============  ================  ==================================================================

torch and transformers are imported lazily, inside the functions.
"""

from __future__ import annotations

import numpy as np

from ..recurrent.mamba2 import Mamba2Mixer, Mamba2State
from ._lazy import require, to_numpy
from .delta_layers import LayerKind, crosscheck_layer, decode_hf, method_replaced, params_as_ours
from .report import CrosscheckReport

HF_MAMBA2_NAME_MAP = {
    "W_in": "in_proj.weight",
    "conv_weight": "conv1d.weight",
    "conv_bias": "conv1d.bias",
    "dt_bias": "dt_bias",
    "A_log": "A_log",
    "D": "D",
    "norm_weight": "norm.weight",
    "W_out": "out_proj.weight",
}
"""Our Mamba2Mixer's parameters -> transformers' (conv1d.weight (C, 1, K) is ours (C, K))."""


# --------------------------------------------------------------------------- the SSD functions, casts lifted


def mamba2_chunk_scan_float64(
    hidden_states, dt, A, B, C, chunk_size, D=None, dt_bias=None, initial_states=None, dt_softplus=False,
    dt_limit=(0.0, float("inf")), return_final_states=False, **kwargs,
):  # fmt: skip
    """transformers' ``mamba2_chunk_scan`` without its ``.float()`` casts (module docstring)."""
    torch = require("torch")
    from transformers.models.mamba2.modeling_mamba2 import pad_tensor_by_size, reshape_into_chunks, segment_sum

    F = torch.nn.functional
    batch_size, sequence_length, num_heads, head_dim = hidden_states.shape
    num_groups = B.shape[2]
    if dt_bias is not None:
        dt = dt + dt_bias.to(dt.dtype)
    if dt_softplus:
        dt = F.softplus(dt)
    dt = torch.clamp(dt, min=dt_limit[0], max=dt_limit[1])
    B = B.repeat_interleave(num_heads // num_groups, dim=2, output_size=num_heads)
    C = C.repeat_interleave(num_heads // num_groups, dim=2, output_size=num_heads)
    pad_size = (chunk_size - sequence_length % chunk_size) % chunk_size
    D_residual = None
    if D is not None:
        D_residual = D[..., None] * pad_tensor_by_size(hidden_states, pad_size)
    hidden_states = hidden_states * dt[..., None]
    A = A.to(hidden_states.dtype) * dt
    hidden_states, A, B, C = [reshape_into_chunks(t, pad_size, chunk_size) for t in (hidden_states, A, B, C)]
    A = A.permute(0, 3, 1, 2)
    A_cumsum = torch.cumsum(A, dim=-1)
    L = torch.exp(segment_sum(A))
    G = torch.einsum("bclhn,bcshn->bclsh", C, B)
    M = G * L.permute(0, 2, 3, 4, 1)
    Y_diag = torch.einsum("bclsh,bcshp->bclhp", M, hidden_states)
    decay_states = torch.exp(A_cumsum[:, :, :, -1:] - A_cumsum)
    B_decay = B * decay_states.permute(0, -2, -1, 1)[..., None]
    states = torch.einsum("bclhn,bclhp->bchpn", B_decay, hidden_states)
    previous_states = (
        initial_states[:, None].to(dtype=states.dtype) if initial_states is not None
        else torch.zeros_like(states[:, :1])
    )  # fmt: skip
    states = torch.cat([previous_states, states], dim=1)
    decay_chunk = torch.exp(segment_sum(F.pad(A_cumsum[:, :, :, -1], (1, 0)))).transpose(1, 3)
    new_states = torch.einsum("bzch,bzhpn->bchpn", decay_chunk, states)
    states, final_state = new_states[:, :-1], new_states[:, -1]
    state_decay_out = torch.exp(A_cumsum)
    C_times_states = torch.einsum("bclhn,bchpn->bclhp", C, states)
    Y_off = C_times_states * state_decay_out.permute(0, 2, 3, 1)[..., None]
    output = (Y_diag + Y_off).contiguous().reshape(batch_size, -1, num_heads, head_dim)
    if D_residual is not None:
        output = output + D_residual
    if pad_size > 0:
        output = output[:, :sequence_length]
    return (output, final_state) if return_final_states else output


def mamba2_selective_state_update_float64(
    state, hidden_states, dt, A, B, C, D=None, dt_bias=None, dt_softplus=False, z=None, **kwargs
):
    """transformers' ``mamba2_selective_state_update`` (one token) without its ``.float()`` casts."""
    torch = require("torch")
    F = torch.nn.functional
    batch_size, num_heads, head_dim = hidden_states.shape
    num_groups, state_size = B.shape[1], B.shape[-1]
    if dt_bias is not None:
        dt = dt + dt_bias.to(dt.dtype)
    if dt_softplus:
        dt = F.softplus(dt)
    dt = dt[..., None]
    dA = torch.exp(dt * A)
    B = B.reshape(batch_size, num_groups, 1, state_size)
    B = B.expand(batch_size, num_groups, num_heads // num_groups, state_size).contiguous()
    B = B.reshape(batch_size, num_heads, 1, state_size)
    dBx = dt * B * hidden_states[..., None]
    ssm_states = state * dA + dBx
    state.copy_(ssm_states.to(state.dtype))
    C = C.reshape(batch_size, num_groups, 1, state_size)
    C = C.expand(batch_size, num_groups, num_heads // num_groups, state_size).contiguous()
    C = C.reshape(batch_size, num_heads, state_size)
    out = torch.bmm(ssm_states.view(batch_size * num_heads, head_dim, state_size), C.view(-1, state_size, 1))
    out = out.view(batch_size, num_heads, head_dim)
    if D is not None:
        out = out + hidden_states * D
    if z is not None:
        out = out * F.silu(z)
    return out


def torch_ssd(x, dt, A, B, C, D=None, initial_state=None, chunk_size=64, d_y=None, d_final_state=None,
              shipped=False) -> dict:  # fmt: skip
    """transformers' chunked scan on our arrays (ours' layout in and out; dt given is the time step itself: no
    softplus, no bias) with torch autograd of Σ d_y·y + d_final_state·S -> {"y", "final_state", and d_y given:
    "x", "dt", "A", "B", "C", "D", "initial_state"}. ``shipped``: the function as shipped (float32 inside)."""
    torch = require("torch")
    from transformers.models.mamba2 import modeling_mamba2 as M

    scan = M.mamba2_chunk_scan if shipped else mamba2_chunk_scan_float64
    named = {"x": x, "dt": dt, "A": A, "B": B, "C": C, "D": D, "initial_state": initial_state}
    t = {n: torch.tensor(np.asarray(a), requires_grad=True) for n, a in named.items() if a is not None}
    S0 = None if initial_state is None else t["initial_state"].transpose(-1, -2)  # ours (N, P) -> theirs (P, N)
    y, S = scan(t["x"].transpose(1, 2), t["dt"].transpose(1, 2), t["A"], t["B"].transpose(1, 2),
                t["C"].transpose(1, 2), chunk_size, D=t.get("D"), initial_states=S0,
                return_final_states=True)  # fmt: skip
    y, S = y.transpose(1, 2), S.transpose(-1, -2)  # (B, H, L, P), (B, H, N, P)
    out = {"y": to_numpy(y), "final_state": to_numpy(S)}
    if d_y is not None:
        loss = (y * torch.tensor(d_y)).sum()
        if d_final_state is not None:
            loss = loss + (S * torch.tensor(d_final_state)).sum()
        grads = torch.autograd.grad(loss, list(t.values()), allow_unused=True)
        out.update({n: None if g is None else to_numpy(g) for n, g in zip(t, grads, strict=True)})
    return out


# --------------------------------------------------------------------------- the layer


def hf_mamba2_mixer(
    hidden_size: int = 8,
    num_heads: int = 4,
    head_dim: int = 4,
    state_size: int = 5,
    n_groups: int = 2,
    conv_kernel: int = 3,
    chunk_size: int = 4,
    time_step_limit=(0.0, float("inf")),
    layer_norm_epsilon: float = 1e-6,
    dtype=np.float64,
    seed: int = 0,
):
    """A small random transformers ``Mamba2Mixer`` (layer 0 of a tiny ``Mamba2Config``, expand = H·P / E), in eval
    mode (in training mode without a cache the module asks for the fused kernel first).

    Weights N(0, 0.3²), the conv's N(0, 0.5²), the norm's N(1, 0.3²) and D N(1, 0.3²) (all ones would hide a swapped
    weight), dt_bias N(0, 0.5²), A_log N(0, 0.5²): the decays e^{A·Δ} spread over (0, 1).
    """
    torch = require("torch")
    require("transformers")
    from transformers import Mamba2Config
    from transformers.models.mamba2.modeling_mamba2 import Mamba2Mixer as HFMamba2Mixer

    expand = num_heads * head_dim // hidden_size
    if expand * hidden_size != num_heads * head_dim:
        raise ValueError(f"num_heads · head_dim = {num_heads * head_dim} must be a multiple of hidden_size = "
                         f"{hidden_size} (Mamba2Config's expand)")  # fmt: skip
    cfg = Mamba2Config(
        hidden_size=hidden_size, num_heads=num_heads, head_dim=head_dim, state_size=state_size, n_groups=n_groups,
        expand=expand, conv_kernel=conv_kernel, chunk_size=chunk_size, time_step_limit=tuple(time_step_limit),
        layer_norm_epsilon=layer_norm_epsilon, num_hidden_layers=1, vocab_size=16,
    )  # fmt: skip
    torch.manual_seed(seed)
    module = HFMamba2Mixer(cfg, layer_idx=0).to(getattr(torch, np.dtype(dtype).name)).eval()
    std = {"conv1d.weight": 0.5, "conv1d.bias": 0.5, "dt_bias": 0.5, "A_log": 0.5}
    with torch.no_grad():
        for name, p in module.named_parameters():
            p.normal_(1.0 if name in ("norm.weight", "D") else 0.0, std.get(name, 0.3))
    return module


def from_hf_mamba2_mixer(module, chunk_size: int | None = None, impl: str = "chunked") -> Mamba2Mixer:
    """transformers ``Mamba2Mixer`` -> our ``Mamba2Mixer``, same weights (copied), same dtype; the chunk size the
    module's unless given."""
    if module.activation != "silu":
        raise ValueError(f"the module's activation is {module.activation!r}; Mamba2Mixer's conv uses silu")
    if module.use_bias or module.conv1d.bias is None:
        raise ValueError("the module's in_proj/out_proj have biases or its conv1d has none; ours: Mamba-2's default "
                         "(use_bias=False, use_conv_bias=True)")  # fmt: skip
    sizes = (module.hidden_size, module.num_heads, module.head_dim, module.ssm_state_size, module.n_groups,
             module.conv_kernel_size, module.layer_norm_epsilon)  # fmt: skip
    options = dict(time_step_limit=tuple(module.time_step_limit), impl=impl,
                   chunk_size=module.chunk_size if chunk_size is None else chunk_size)  # fmt: skip
    shapes = Mamba2Mixer(*sizes, rng=0, **options).param_shapes()
    params = params_as_ours(dict(module.named_parameters()), HF_MAMBA2_NAME_MAP, shapes)
    return Mamba2Mixer(*sizes, params=params, dtype=params["W_out"].dtype, **options)


def _norm_without_casts(norm, hidden_states, gate):
    """``MambaRMSNormGated.forward`` without its float32 round trip."""
    torch = require("torch")
    hidden_states = hidden_states * torch.nn.functional.silu(gate)
    *prefix_dims, last_dim = hidden_states.shape
    group = hidden_states.view(*prefix_dims, last_dim // norm.group_size, norm.group_size)
    group = group * torch.rsqrt(group.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
    return norm.weight * group.view(*prefix_dims, last_dim)


def _forward_without_casts(self, hidden_states, cache=None, attention_mask=None, **kwargs):
    """``Mamba2Mixer.forward``'s torch path line for line, without its float32 casts (module docstring)."""
    torch = require("torch")
    from transformers.models.mamba2 import modeling_mamba2 as M

    batch_size, seq_len, _ = hidden_states.shape
    if cache is not None:
        conv_state = cache.get_conv_state(self.layer_idx, state_idx=0)
        recurrent_state = cache.get_recurrent_state(self.layer_idx, state_idx=0)
    else:
        conv_state, recurrent_state = None, None
    hidden_states = M.apply_mask_to_padding_states(hidden_states, attention_mask)
    projected_states = self.in_proj(hidden_states)
    A = -torch.exp(self.A_log)  # lifted: no .float()
    gate, hidden_states_B_C, dt = projected_states.split([self.intermediate_size, self.conv_dim, self.num_heads], -1)
    hidden_states_B_C = hidden_states_B_C.transpose(1, 2)
    weight = self.conv1d.weight.squeeze(1)
    if conv_state is not None and seq_len == 1 and not cache.is_recording_past(self.layer_idx):
        hidden_states_B_C = M.causal_conv1d_update(hidden_states_B_C, conv_state, weight, self.conv1d.bias,
                                                   activation=self.activation)  # fmt: skip
    else:
        if cache is not None:
            hidden_states_B_C = cache.update_conv_state(hidden_states_B_C, self.layer_idx,
                                                        conv_kernel_size=self.conv_kernel_size)  # fmt: skip
        hidden_states_B_C = M.causal_conv1d_fn(hidden_states_B_C, weight, self.conv1d.bias, activation=self.activation)
        if cache is not None:
            hidden_states_B_C = hidden_states_B_C[:, :, -seq_len:]
    hidden_states_B_C = M.apply_mask_to_padding_states(hidden_states_B_C.transpose(1, 2), attention_mask)
    gn = self.n_groups * self.ssm_state_size
    hidden_states, B, C = torch.split(hidden_states_B_C, [self.intermediate_size, gn, gn], dim=-1)
    if recurrent_state is not None and seq_len == 1:
        hidden_states = hidden_states.view(batch_size, self.num_heads, self.head_dim)
        dt = dt.transpose(1, 2).expand(-1, -1, self.head_dim)
        A = A[:, None, None].expand(-1, self.head_dim, self.ssm_state_size)
        B = B.view(batch_size, self.n_groups, self.ssm_state_size)
        C = C.view(batch_size, self.n_groups, self.ssm_state_size)
        D = self.D[:, None].expand(-1, self.head_dim)
        dt_bias = self.dt_bias[:, None].expand(-1, self.head_dim)
        scan_output = mamba2_selective_state_update_float64(recurrent_state, hidden_states, dt, A, B, C, D, z=None,
                                                            dt_bias=dt_bias, dt_softplus=True)  # fmt: skip
        scan_output = scan_output.view(batch_size, 1, -1)
    else:
        scan_output, final_state = mamba2_chunk_scan_float64(
            hidden_states.view(batch_size, seq_len, self.num_heads, self.head_dim), dt, A,
            B.view(batch_size, seq_len, self.n_groups, self.ssm_state_size),
            C.view(batch_size, seq_len, self.n_groups, self.ssm_state_size), chunk_size=self.chunk_size, D=self.D,
            return_final_states=True, dt_bias=self.dt_bias, dt_softplus=True, initial_states=recurrent_state,
            dt_limit=self.time_step_limit,
        )  # fmt: skip
        if cache is not None:
            cache.update_recurrent_state(final_state, layer_idx=self.layer_idx)
        scan_output = scan_output.reshape(batch_size, seq_len, -1)
    return self.out_proj(_norm_without_casts(self.norm, scan_output, gate))


def mamba2_in_float64(module):
    """Within the block the module runs ``_forward_without_casts``; the class's forward again afterwards."""
    return method_replaced(module, _forward_without_casts)


def _config():
    from transformers import Mamba2Config

    return Mamba2Config(num_hidden_layers=1)


KIND = LayerKind(
    "Mamba2Mixer", HF_MAMBA2_NAME_MAP, mamba2_in_float64, _config, Mamba2State, lambda s: s.transpose(0, 1, 3, 2)
)


def crosscheck_hf_mamba2_mixer(
    module, hidden_states, attention_mask=None, d_output=None, rng=0, rtol=None, impl: str = "chunked",
    chunk_size: int | None = None,
) -> CrosscheckReport:  # fmt: skip
    """A transformers ``Mamba2Mixer`` against ``from_hf_mamba2_mixer(module)``: output, the state after the call
    (conv and SSM), dL/dx and every parameter's gradient by torch autograd.

    hidden_states (B, L, E); attention_mask (B, L) bool (True = a token) or None. float64: against the module with
    its casts lifted (``mamba2_in_float64``), default 1e-10, the as-shipped gap in a note; float32: against the
    module as shipped, default 1e-5.
    """
    layer = from_hf_mamba2_mixer(module, chunk_size=chunk_size, impl=impl)
    title = (f"ours vs transformers Mamba2Mixer (H={layer.num_heads}, P={layer.head_dim}, N={layer.state_size}, "
             f"G={layer.n_groups}, K={layer.conv_kernel_size}, {impl}"
             f"{', padding' if attention_mask is not None else ''})")  # fmt: skip
    return crosscheck_layer(KIND, module, layer, hidden_states, attention_mask, d_output, rng, rtol, title)


def decode_hf_mamba2_mixer(module, hidden_states, prefill: int = 3, lifted: bool = True):
    """transformers' decoding with its cache (a prefill, then one token a call) -> (outputs, Mamba2State)."""
    return decode_hf(KIND, module, hidden_states, prefill, lifted)
