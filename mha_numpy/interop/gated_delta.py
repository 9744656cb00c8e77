"""The gated delta rule against transformers: copies of its torch functions with the float32 casts lifted.

transformers computes ``torch_chunk_gated_delta_rule`` and ``torch_recurrent_gated_delta_rule`` (Qwen3-Next,
``transformers.models.qwen3_next.modeling_qwen3_next``) and ``chunk_kimi_delta_attention`` /
``recurrent_kimi_delta_attention`` (Kimi Linear, ``transformers.models.kimi_linear.modeling_kimi_linear``) in
float32 whatever the input (``.to(torch.float32)``; float64 inputs give a float32 state). The copies below are its
code line for line with those casts removed, so a float64 check runs in float64 (as ``interop.qwen3`` lifts
Qwen3RMSNorm's); the float32 check uses the functions as shipped. Other changes: none but the dtype (the Qwen3-Next
chunked copy keeps ``solve_triangular``, transformers' non-export path).

Their layout is (B, L, H, d) (g, beta (B, L, H); Kimi's g (B, L, H, dk)); ours is (B, H, L, d):
``torch_gated_delta_rule`` runs either on our arrays, transposing at the edge, with autograd for the gradients.
torch and transformers are imported lazily, inside the functions.
"""

from __future__ import annotations

import numpy as np

from ._lazy import require


def l2norm(x, dim: int = -1, eps: float = 1e-6):
    """transformers' Qwen3-Next ``l2norm``: x · rsqrt(Σ x² + eps)."""
    torch = require("torch")
    return x * torch.rsqrt((x * x).sum(dim=dim, keepdim=True) + eps)


def torch_chunk_gated_delta_rule_float64(
    query, key, value, g, beta, chunk_size=64, initial_state=None, output_final_state=False,
    use_qk_l2norm_in_kernel=False,
):  # fmt: skip
    """transformers' ``torch_chunk_gated_delta_rule`` without its float32 casts (shapes as there: (B, L, H, d))."""
    torch = require("torch")
    F = torch.nn.functional
    batch_size, sequence_length, num_k_heads, k_head_dim = key.shape
    num_v_heads, v_head_dim = value.shape[-2:]
    recurrent_state_shape = (batch_size, num_v_heads, k_head_dim, v_head_dim)
    padded_output_shape = (batch_size, num_v_heads, -1, v_head_dim)
    decay = g
    if num_k_heads != num_v_heads:
        query = query.repeat_interleave(num_v_heads // num_k_heads, dim=2)
        key = key.repeat_interleave(num_v_heads // num_k_heads, dim=2)
    query, key, value, beta, decay = [x.transpose(1, 2).contiguous() for x in (query, key, value, beta, decay)]
    if use_qk_l2norm_in_kernel:
        query = l2norm(query, dim=-1, eps=1e-6)
        key = l2norm(key, dim=-1, eps=1e-6)
    scaling = query.shape[-1] ** -0.5
    query = query * scaling
    pad_size = (chunk_size - sequence_length % chunk_size) % chunk_size
    query, key, value = (F.pad(x, (0, 0, 0, pad_size)) for x in (query, key, value))
    beta, decay = (F.pad(x, (0, pad_size)) for x in (beta, decay))
    total_sequence_length = sequence_length + pad_size
    num_chunks = total_sequence_length // chunk_size
    v_beta = value * beta.unsqueeze(-1)
    k_beta = key * beta.unsqueeze(-1)
    query, key, k_beta, v_beta = [
        x.reshape(x.shape[0], x.shape[1], -1, chunk_size, x.shape[-1]) for x in (query, key, k_beta, v_beta)
    ]
    decay = decay.reshape(decay.shape[0], decay.shape[1], -1, chunk_size)
    strictly_upper_mask = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=query.device).triu(1)
    cum_decay = decay.cumsum(dim=3)
    pairwise_decay = cum_decay.unsqueeze(4) - cum_decay.unsqueeze(3)
    pairwise_decay = pairwise_decay.masked_fill(strictly_upper_mask, float("-inf"))
    pairwise_decay = pairwise_decay.exp()
    ut_system = (k_beta @ key.transpose(-1, -2)) * pairwise_decay
    intra_chunk_attn = (query @ key.transpose(-1, -2)) * pairwise_decay
    decayed_k_beta = k_beta * cum_decay.exp().unsqueeze(-1)
    new_values = torch.linalg.solve_triangular(ut_system, v_beta, upper=False, unitriangular=True)
    k_cumdecay = torch.linalg.solve_triangular(ut_system, decayed_k_beta, upper=False, unitriangular=True)
    if initial_state is None:
        last_recurrent_state = torch.zeros(recurrent_state_shape, dtype=new_values.dtype, device=new_values.device)
    else:
        last_recurrent_state = initial_state.to(new_values)
    core_attn_out = torch.zeros_like(new_values)
    query = query * cum_decay.exp().unsqueeze(-1)
    key = key * (cum_decay[..., -1:] - cum_decay).exp().unsqueeze(-1)
    chunk_decay = cum_decay[..., -1].exp()[..., None, None]
    for i in range(num_chunks):
        v_new = new_values[:, :, i] - k_cumdecay[:, :, i] @ last_recurrent_state
        inter_chunk_attn = query[:, :, i] @ last_recurrent_state
        core_attn_out[:, :, i] = inter_chunk_attn + intra_chunk_attn[:, :, i] @ v_new
        last_recurrent_state = last_recurrent_state * chunk_decay[:, :, i] + key[:, :, i].transpose(-1, -2) @ v_new
    last_recurrent_state = None if not output_final_state else last_recurrent_state
    core_attn_out = core_attn_out.reshape(padded_output_shape)
    core_attn_out = core_attn_out[:, :, :sequence_length]
    core_attn_out = core_attn_out.transpose(1, 2).contiguous()
    return core_attn_out, last_recurrent_state


def torch_recurrent_gated_delta_rule_float64(
    query, key, value, g, beta, initial_state=None, output_final_state=False, use_qk_l2norm_in_kernel=False
):
    """transformers' ``torch_recurrent_gated_delta_rule`` without its float32 casts ((B, L, H, d) as there)."""
    torch = require("torch")
    batch_size, sequence_length, num_k_heads, k_head_dim = key.shape
    num_v_heads, v_head_dim = value.shape[-2:]
    decay = g
    if num_k_heads != num_v_heads:
        query = query.repeat_interleave(num_v_heads // num_k_heads, dim=2)
        key = key.repeat_interleave(num_v_heads // num_k_heads, dim=2)
    query, key, value, beta, decay = [x.transpose(1, 2).contiguous() for x in (query, key, value, beta, decay)]
    if use_qk_l2norm_in_kernel:
        query = l2norm(query, dim=-1, eps=1e-6)
        key = l2norm(key, dim=-1, eps=1e-6)
    query = query / (query.shape[-1] ** 0.5)
    if initial_state is None:
        recurrent_state_shape = (batch_size, num_v_heads, k_head_dim, v_head_dim)
        last_recurrent_state = torch.zeros(recurrent_state_shape, dtype=value.dtype, device=value.device)
    else:
        last_recurrent_state = initial_state.to(value)
    core_attn_out = torch.zeros_like(value)
    for i in range(sequence_length):
        q_t, k_t, v_t = query[:, :, i], key[:, :, i], value[:, :, i]
        decay_t = decay[:, :, i].exp()[..., None, None]
        last_recurrent_state = last_recurrent_state * decay_t
        beta_t = beta[:, :, i].unsqueeze(-1)
        kv_mem = (last_recurrent_state * k_t.unsqueeze(-1)).sum(dim=-2)
        delta = (v_t - kv_mem) * beta_t
        last_recurrent_state = last_recurrent_state + k_t.unsqueeze(-1) * delta.unsqueeze(-2)
        core_attn_out[:, :, i] = (last_recurrent_state * q_t.unsqueeze(-1)).sum(dim=-2)
    last_recurrent_state = None if not output_final_state else last_recurrent_state
    core_attn_out = core_attn_out.transpose(1, 2).contiguous()
    return core_attn_out, last_recurrent_state


def kimi_l2norm(x, dim: int = -1, eps: float = 1e-6):
    """transformers' Kimi Linear ``l2norm``: x / sqrt(Σ x² + eps) (the same map, another rounding)."""
    torch = require("torch")
    return x / torch.sqrt((x * x).sum(dim=dim, keepdim=True) + eps)


def recurrent_kimi_delta_attention_float64(
    query, key, value, g, beta, initial_state, output_final_state, use_qk_l2norm_in_kernel=False
):
    """transformers' ``recurrent_kimi_delta_attention`` without its float32 casts: (B, L, H, d), g (B, L, H, dk)."""
    torch = require("torch")
    if use_qk_l2norm_in_kernel:
        query = kimi_l2norm(query, dim=-1, eps=1e-6)
        key = kimi_l2norm(key, dim=-1, eps=1e-6)
    batch_size, sequence_length, num_heads, k_head_dim = key.shape
    v_head_dim = value.shape[-1]
    scale = 1 / (query.shape[-1] ** 0.5)
    query = query * scale
    core_attn_out = torch.zeros(
        batch_size, sequence_length, num_heads, v_head_dim, dtype=value.dtype, device=value.device
    )
    last_recurrent_state = (
        torch.zeros(batch_size, num_heads, k_head_dim, v_head_dim, dtype=value.dtype, device=value.device)
        if initial_state is None
        else initial_state.to(value)
    )
    for i in range(sequence_length):
        q_i = query[:, i]
        k_i = key[:, i]
        v_i = value[:, i]
        g_i = g[:, i][..., None].exp()
        b_i = beta[:, i][..., None]
        last_recurrent_state = last_recurrent_state * g_i
        kv_mem = (last_recurrent_state * k_i[..., None]).sum(dim=-2)
        delta = (v_i - kv_mem) * b_i
        last_recurrent_state = last_recurrent_state + k_i.unsqueeze(-1) * delta.unsqueeze(-2)
        core_attn_out[:, i] = (last_recurrent_state * q_i.unsqueeze(-1)).sum(dim=-2)
    return core_attn_out, last_recurrent_state if output_final_state else None


def chunk_kimi_delta_attention_float64(
    query, key, value, g, beta, chunk_size=64, initial_state=None, output_final_state=False,
    use_qk_l2norm_in_kernel=False,
):  # fmt: skip
    """transformers' ``chunk_kimi_delta_attention`` without its float32 casts: (B, L, H, d), g (B, L, H, dk)."""
    torch = require("torch")
    F = torch.nn.functional
    query, key, value, beta, g = [x.transpose(1, 2).contiguous() for x in (query, key, value, beta, g)]
    if use_qk_l2norm_in_kernel:
        query = kimi_l2norm(query, dim=-1, eps=1e-6)
        key = kimi_l2norm(key, dim=-1, eps=1e-6)
    batch_size, num_heads, sequence_length, k_head_dim = key.shape
    v_head_dim = value.shape[-1]
    scale = 1 / (query.shape[-1] ** 0.5)
    pad_size = (chunk_size - sequence_length % chunk_size) % chunk_size
    total_sequence_length = sequence_length + pad_size
    query = F.pad(query, (0, 0, 0, pad_size)) * scale
    key = F.pad(key, (0, 0, 0, pad_size))
    value = F.pad(value, (0, 0, 0, pad_size))
    g = F.pad(g, (0, 0, 0, pad_size))
    beta = F.pad(beta, (0, pad_size))
    v_beta = value * beta.unsqueeze(-1)
    k_beta = key * beta.unsqueeze(-1)
    query, key, value, g, k_beta, v_beta = [
        x.reshape(x.shape[0], x.shape[1], -1, chunk_size, x.shape[-1]) for x in (query, key, value, g, k_beta, v_beta)
    ]
    beta = beta.reshape(beta.shape[0], beta.shape[1], -1, chunk_size)
    g = g.cumsum(dim=-2)
    mask = torch.triu(torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=query.device), diagonal=0)
    strict_mask = torch.triu(torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=query.device), diagonal=1)
    decay_mask = (g.unsqueeze(-2) - g.unsqueeze(-3)).masked_fill(strict_mask[..., None], float("-inf")).exp()
    attn = -(k_beta.unsqueeze(-2) * key.unsqueeze(-3) * decay_mask).sum(dim=-1).masked_fill(mask, 0)
    for i in range(1, chunk_size):
        row = attn[..., i, :i].clone()
        sub = attn[..., :i, :i].clone()
        attn[..., i, :i] = row + (row.unsqueeze(-1) * sub).sum(-2)
    attn = attn + torch.eye(chunk_size, dtype=attn.dtype, device=attn.device)
    value = attn @ v_beta
    k_cumdecay = attn @ (k_beta * g.exp())
    last_recurrent_state = (
        torch.zeros(batch_size, num_heads, k_head_dim, v_head_dim, dtype=value.dtype, device=value.device)
        if initial_state is None
        else initial_state.to(value)
    )
    core_attn_out = torch.zeros_like(value)
    mask = torch.triu(torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=query.device), diagonal=1)
    for i in range(total_sequence_length // chunk_size):
        q_i = query[:, :, i]
        k_i = key[:, :, i]
        v_i = value[:, :, i]
        g_i = g[:, :, i]
        attn_inter = (q_i * g_i.exp()) @ last_recurrent_state
        attn_intra = (q_i.unsqueeze(-2) * k_i.unsqueeze(-3) * decay_mask[:, :, i]).sum(dim=-1).masked_fill(mask, 0)
        v_prime = k_cumdecay[:, :, i] @ last_recurrent_state
        v_new = v_i - v_prime
        core_attn_out[:, :, i] = attn_inter + attn_intra @ v_new
        last_recurrent_state = (
            last_recurrent_state * g_i[:, :, -1].exp().unsqueeze(-1)
            + (k_i * (g_i[:, :, -1:] - g_i).exp()).transpose(-1, -2) @ v_new
        )
    if not output_final_state:
        last_recurrent_state = None
    core_attn_out = core_attn_out.reshape(core_attn_out.shape[0], core_attn_out.shape[1], -1, core_attn_out.shape[-1])
    core_attn_out = core_attn_out[:, :, :sequence_length]
    core_attn_out = core_attn_out.transpose(1, 2).contiguous()
    return core_attn_out, last_recurrent_state


def _theirs(impl: str, per_channel: bool, shipped: bool):
    """The function to call: the cast-lifted copy or (``shipped``) transformers' own."""
    if shipped and per_channel:
        from transformers.models.kimi_linear import modeling_kimi_linear as kimi  # noqa: PLC0415

        return kimi.chunk_kimi_delta_attention if impl == "chunked" else kimi.recurrent_kimi_delta_attention
    if shipped:
        from transformers.models.qwen3_next import modeling_qwen3_next as qwen  # noqa: PLC0415

        return qwen.torch_chunk_gated_delta_rule if impl == "chunked" else qwen.torch_recurrent_gated_delta_rule
    if per_channel:
        return chunk_kimi_delta_attention_float64 if impl == "chunked" else recurrent_kimi_delta_attention_float64
    return torch_chunk_gated_delta_rule_float64 if impl == "chunked" else torch_recurrent_gated_delta_rule_float64


def torch_gated_delta_rule(
    q, k, v, g, beta, initial_state=None, impl="chunked", chunk_size=64, use_qk_l2norm=False, shipped=False,
    d_o=None, d_final_state=None,
):  # fmt: skip
    """transformers' gated delta rule on our (B, H, L, d) arrays -> (o, final_state, grads or None), arrays.

    q, k (B, Hk, L, dk), v (B, H, L, dv), g (B, H, L), or (B, H, L, dk) for Kimi Delta Attention (its functions,
    Hk = H), beta (B, H, L), initial_state (B, H, dk, dv) or None. ``shipped=False``: the cast-lifted
    copies above (float64 stays float64); ``shipped=True``: transformers' functions as shipped (float32 inside).
    With ``d_o`` given, torch autograd of <d_o, o> + <d_final_state, final_state> gives
    {"q", "k", "v", "g", "beta", "initial_state"} (the last None when no initial state was given).
    """
    torch = require("torch")
    arrays = {"q": q, "k": k, "v": v, "g": g, "beta": beta, "initial_state": initial_state}
    leaves = {n: torch.from_numpy(np.ascontiguousarray(a)).requires_grad_(d_o is not None)
              for n, a in arrays.items() if a is not None}  # fmt: skip
    per_channel = np.ndim(g) == 4
    bl = {n: t.transpose(1, 2) for n, t in leaves.items() if n != "initial_state"}  # (B, H, L, ·) -> (B, L, H, ·)
    fn = _theirs(impl, per_channel, shipped)
    state = leaves.get("initial_state")
    kw = {"chunk_size": chunk_size} if impl == "chunked" else {}
    if per_channel and impl == "recurrent":  # its signature: initial_state, output_final_state positional
        o, S = fn(bl["q"], bl["k"], bl["v"], bl["g"], bl["beta"], state, True, use_qk_l2norm_in_kernel=use_qk_l2norm)
    else:
        o, S = fn(bl["q"], bl["k"], bl["v"], bl["g"], bl["beta"], initial_state=state, output_final_state=True,
                  use_qk_l2norm_in_kernel=use_qk_l2norm, **kw)  # fmt: skip
    o = o.transpose(1, 2)  # (B, L, H, dv) -> (B, H, L, dv)
    grads = None
    if d_o is not None:
        loss = (o * torch.from_numpy(np.asarray(d_o)).to(o.dtype)).sum()
        if d_final_state is not None:
            loss = loss + (S * torch.from_numpy(np.asarray(d_final_state)).to(S.dtype)).sum()
        names = list(leaves)
        got = torch.autograd.grad(loss, [leaves[n] for n in names], allow_unused=True)
        grads = {n: None for n in arrays}
        grads.update(
            {n: (t.numpy() if t is not None else np.zeros_like(arrays[n])) for n, t in zip(names, got, strict=True)}
        )
    return o.detach().numpy(), S.detach().numpy(), grads
