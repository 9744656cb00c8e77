"""Two options of issue 38, each a step (or two) and a pair of the one module:

- output_gate=True: Qwen3-Next's sigmoid gate on the attention output. q_proj is 2·H·d wide, each head's features
  [query | gate]; output = o_proj(context · sigmoid(gate)). Against transformers' ``Qwen3NextAttention`` in float64
  (sdpa: its eager path takes the softmax in float32).
- partial_rotary_factor: RoPE turns the first int(d · factor) features of each head (Hugging Face's name: Phi,
  StableLM, Qwen3-Next's 0.25). Against transformers' ``apply_rotary_pos_emb`` with cos, sin that wide.

Each also gradient-checked by central differences, on every kernel, with recompute=True and decoding with a KV cache.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import check_recompute_and_decoding, directional_errors, grad_check_self_attention

from mha_numpy import MultiHeadAttention, kernels, masks, steps
from mha_numpy import functional as F

torch = pytest.importorskip("torch")
qwen3_next = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")
Qwen3NextConfig = pytest.importorskip("transformers").Qwen3NextConfig

KERNELS = {"vectorized": {}, "naive": {}, "chunked": dict(block_size=2, num_threads=2)}
STEPS = {
    "gate": dict(output_gate=True),
    "partial": dict(partial_rotary_factor=0.5),
    "both": dict(output_gate=True, partial_rotary_factor=0.5, qk_norm=True),
}
B, H, HKV, D, L, THETA = 2, 4, 2, 4, 5, 30.0
E = H * D


def make(step, impl, **kw):
    mha = MultiHeadAttention(E, H, num_kv_heads=HKV, rope_theta=THETA, rng=0,
                             impl=kernels.get_kernel(impl, **KERNELS[impl]), **{**STEPS[step], **kw})  # fmt: skip
    rng = np.random.default_rng(1)
    for name, p in mha.params.items():  # nonzero biases, norm weights away from 1
        p[...] = rng.normal(1.0 if name.endswith("_norm") else 0.0, 0.5, p.shape) if p.ndim == 1 else p
    return mha


def cos_sin(positions, rotary_dim):
    """Hugging Face's default RoPE (``compute_default_rope_parameters`` and the rotary embedding's forward) in
    float64: inv_freq = 1 / theta^(arange(0, r, 2) / r), emb = [freqs, freqs]. -> cos, sin (1, L, r)."""
    inv_freq = 1.0 / THETA ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)
    freqs = torch.as_tensor(positions, dtype=torch.float64)[None, :, None] * inv_freq  # (1, L, r/2)
    emb = torch.cat((freqs, freqs), dim=-1)  # (1, L, r)
    return emb.cos(), emb.sin()


# --------------------------------------------------------------------------- the output gate, against Qwen3-Next


def qwen3_next_attention(mha, lifted=True):
    """transformers' Qwen3NextAttention with the module's weights, in the module's dtype. lifted: its float32 casts
    lifted (sdpa, whose softmax stays in the dtype, and its RMSNorm's formula without x.float()); else as shipped
    (eager, softmax and norms in float32)."""
    config = Qwen3NextConfig(hidden_size=E, num_attention_heads=H, num_key_value_heads=HKV, head_dim=D,
                             attention_bias=True, rms_norm_eps=mha.qk_norm_eps, attention_dropout=0.0,
                             rope_parameters={"rope_type": "default", "rope_theta": THETA,
                                              "partial_rotary_factor": mha.partial_rotary_factor})  # fmt: skip
    config._attn_implementation = "sdpa" if lifted else "eager"  # eager takes its softmax in float32
    ref = qwen3_next.Qwen3NextAttention(config, layer_idx=0).to(
        torch.float64 if mha.dtype == np.float64 else torch.float32
    )
    P = {n: torch.tensor(p) for n, p in mha.params.items()}
    with torch.no_grad():
        for ours, theirs in (("q", ref.q_proj), ("k", ref.k_proj), ("v", ref.v_proj), ("o", ref.o_proj)):
            theirs.weight.copy_(P[f"W_{ours}"])  # W_q (2·H·d, E): head h's rows [query_h | gate_h], as q_proj's
            theirs.bias.copy_(P[f"b_{ours}"])
        for norm in (ref.q_norm, ref.k_norm):
            norm.weight.copy_(P[norm is ref.q_norm and "q_norm" or "k_norm"] - 1.0)  # theirs scales by 1 + weight
            if lifted:  # Qwen3NextRMSNorm computes in float32 (x.float()); its own formula, in the tensor's dtype:
                norm.forward = lambda x, n=norm: n._norm(x) * (1.0 + n.weight)
    return ref


@pytest.mark.parametrize("impl", list(KERNELS))
def test_output_gate_matches_qwen3_next_attention_with_every_gradient(impl, rng):
    """Output and every gradient (input, the four projections' weights and biases, the two norms) of the module with
    output_gate, qk_norm and partial_rotary_factor=0.5 against Qwen3NextAttention's under torch autograd."""
    mha = make("both", impl)
    ref = qwen3_next_attention(mha)
    x, d_out = rng.standard_normal((B, L, E)), rng.standard_normal((B, L, E))
    allowed = np.broadcast_to(masks.causal_mask(L), (B, 1, L, L)).copy()
    allowed[1, ..., 0] = False  # batch element 1's first key is padding (every row keeps its own key)
    allowed[1, 0, 0, 0] = True
    out, cache = mha.forward(x, x, x, mask=allowed)
    grads = mha.backward(d_out, cache)
    xt = torch.tensor(x, requires_grad=True)
    additive = torch.tensor(np.where(allowed, 0.0, -np.inf))  # (B, 1, L, L)
    out_ref, _ = ref(xt, position_embeddings=cos_sin(np.arange(L), D // 2), attention_mask=additive)
    out_ref.backward(torch.tensor(d_out))
    assert np.abs(out - out_ref.detach().numpy()).max() <= 1e-10
    theirs = {f"W_{n}": getattr(ref, f"{n}_proj").weight.grad for n in "qkvo"}
    theirs.update({f"b_{n}": getattr(ref, f"{n}_proj").bias.grad for n in "qkvo"})
    theirs.update(q_norm=ref.q_norm.weight.grad, k_norm=ref.k_norm.weight.grad, x=xt.grad)
    ours = {**grads, "x": grads["query"] + grads["key"] + grads["value"]}
    assert set(theirs) == set(mha.params) | {"x"}
    for name, g in theirs.items():
        assert np.abs(ours[name] - g.numpy()).max() <= 1e-10, name
    gate_rows = (np.arange(2 * H * D) // D) % 2 == 1  # head h's rows 2hd + d ... 2hd + 2d - 1: its gate
    assert np.abs(grads["W_q"][gate_rows]).max() > 1e-3  # the gate's half learns (its gradient reaches q)


def test_output_gate_against_qwen3_next_as_shipped_and_in_float32(rng):
    """As shipped (eager, softmax and RMSNorm in float32 inside a float64 module) the gap is that of float32, ~1e-8
    at these sizes; in float32 both agree to 1e-5."""
    x = rng.standard_normal((B, L, E))
    causal = torch.triu(torch.full((L, L), -torch.inf, dtype=torch.float64), 1)[None, None]  # (1, 1, L, L)
    cos, sin = cos_sin(np.arange(L), D // 2)
    mha = make("both", "vectorized")
    shipped = qwen3_next_attention(mha, lifted=False)(torch.tensor(x), (cos, sin), causal)[0].detach().numpy()
    gap = np.abs(mha.forward(x, x, x, mask=masks.causal_mask(L))[0] - shipped).max()
    assert 1e-12 < gap <= 1e-6, gap  # the float32 casts show, and only they
    single = make("both", "vectorized", dtype=np.float32)
    single.params.update({n: p.astype(np.float32) for n, p in mha.params.items()})
    ref = qwen3_next_attention(single, lifted=False)
    out_ref = ref(torch.tensor(x, dtype=torch.float32), (cos.float(), sin.float()), causal.float())[0]
    out = single.forward(*[x.astype(np.float32)] * 3, mask=masks.causal_mask(L))[0]
    assert out.dtype == np.float32 and np.abs(out - out_ref.detach().numpy()).max() <= 1e-5


# --------------------------------------------------------------------------- partial rotary, against transformers


def test_partial_rope_matches_transformers_apply_rotary_pos_emb(rng):
    """Qwen3-Next's factor 0.25 of d = 16 (4 features turned), at given positions, on queries and keys."""
    d, r = 16, 4
    q, k = rng.standard_normal((B, H, L, d)), rng.standard_normal((B, HKV, L, d))
    positions = np.array([3, 0, 7, 2, 9])
    cos, sin = cos_sin(positions, r)
    q_ref, k_ref = qwen3_next.apply_rotary_pos_emb(torch.tensor(q), torch.tensor(k), cos, sin)
    q_ours, k_ours = (F.partial_rope_forward(a, positions, THETA, r)[0] for a in (q, k))
    assert np.abs(q_ours - q_ref.numpy()).max() <= 1e-14 and np.abs(k_ours - k_ref.numpy()).max() <= 1e-14
    assert np.array_equal(q_ours[..., r:], q[..., r:])  # the rest of each head passes through
    full = F.partial_rope_forward(q, positions, THETA, d)[0]  # all of it: RoPE itself
    assert np.array_equal(full, F.rope_forward(q, positions, THETA)[0])


# --------------------------------------------------------------------------- both, on every kernel


@pytest.mark.parametrize("impl", list(KERNELS))
@pytest.mark.parametrize("step", ["gate", "partial"])
def test_central_differences(step, impl, rng):
    """Entry by entry on the vectorized kernel; along a random direction per input and parameter on the others."""
    mha, x = make(step, impl), rng.standard_normal((B, L, E))
    if impl == "vectorized":
        grad_check_self_attention(mha, x, masks.causal_mask(L))
    else:
        errors = directional_errors(mha, x, dict(mask=masks.causal_mask(L)), rng)
        assert max(errors.values()) <= 1e-7, errors


@pytest.mark.parametrize("impl", list(KERNELS))
@pytest.mark.parametrize("step", list(STEPS))
def test_recompute_and_decoding(step, impl, rng):
    default, lean = make(step, impl), make(step, impl, recompute=True)
    x = rng.standard_normal((B, L, E))
    check_recompute_and_decoding(default, lean, x, rng)


def test_the_options_change_the_output_and_bad_values_are_refused():
    x = np.random.default_rng(3).standard_normal((B, L, E))
    full, half = make("partial", "vectorized", partial_rotary_factor=1.0), make("partial", "vectorized")
    assert np.abs(full.forward(x, x, x)[0] - half.forward(x, x, x)[0]).max() > 1e-3
    assert MultiHeadAttention(E, H, output_gate=True).params["W_q"].shape == (2 * E, E)
    single = MultiHeadAttention(E, H, output_gate=True, rope_theta=THETA, partial_rotary_factor=0.5, dtype=np.float32)
    out, cache = single.forward(*[x.astype(np.float32)] * 3)
    assert out.dtype == np.float32 and all(g.dtype == np.float32 for g in single.backward(out, cache).values())
    for factor, match in ((0.0, "positive"), (1.5, r"\(0, 1\]"), (0.25, "even"), (True, "positive")):
        with pytest.raises(ValueError, match=f"partial_rotary_factor.*{match}"):
            MultiHeadAttention(E, H, rope_theta=THETA, partial_rotary_factor=factor)  # d = 4: 0.25 turns 1
    with pytest.raises(ValueError, match="output_gate with diff_attention"):
        MultiHeadAttention(E, H, num_kv_heads=2, output_gate=True, diff_attention=True)
    latent = steps.OPTIONS["kv_lora_rank"].example
    with pytest.raises(ValueError, match="output_gate with kv_lora_rank"):
        MultiHeadAttention(E, H, output_gate=True, **latent)._plan(kv_cache=False)
    with pytest.raises(ValueError, match="partial_rotary_factor=0.5 with kv_lora_rank"):
        MultiHeadAttention(E, H, partial_rotary_factor=0.5, **latent)
