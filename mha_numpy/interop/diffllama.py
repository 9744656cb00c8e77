"""Differential attention against Hugging Face DiffLlama: the importer, the attention and the KV cache.

torch and transformers are imported lazily, inside the functions. ``DiffLlamaAttention`` with E = hidden_size,
H = num_attention_heads, Hkv = num_key_value_heads (even), d = head_dim:

=====================  ======================  =========================================================
ours                   DiffLlamaAttention      shape
=====================  ======================  =========================================================
W_q, b_q               q_proj                  (H·d, E), (H·d,)
W_k, b_k               k_proj                  (Hkv·d, E), (Hkv·d,)
W_v, b_v               v_proj                  (Hkv·d, E), (Hkv·d,)
W_o, b_o               o_proj                  (E, H·d), (E,)  (biases only with attention_bias=True)
lambda_q1 ... k2       lambda_q1 ... k2        (d,) each
diff_layer_idx         layer_idx               λ_init = 0.8 − 0.6 · exp(−0.3 · layer_idx)
diff_norm_eps          groupnorm.eps           the RMSNorm over a pair's 2d features (no weight)
rope_theta             config.rope_parameters["rope_theta"]  (rope_type "default" only)
=====================  ======================  =========================================================

HF runs two attention calls that share Q and K, one on each half of V; its pairs are heads p and p + H/2 (its
``torch.chunk(..., 2, dim=2)``), ours too (``steps.DiffValues``, ``steps.DiffCombine``). The attention weights it
returns are the first call's, the H softmax maps themselves (the second call's are the same maps), not their
difference: ours are ``cache.attn_weights``, the same (B, H, L, L) maps.

Three of its steps round through float32 whatever its dtype: the eager attention's softmax (``dtype=torch.float32``),
λ's two dot products (``torch.sum(..., dtype=torch.float32)``) and the angles of its rotary module. The cross-checks
hand it (cos, sin) built in float64 (``llama.torch_cos_sin``) and, in float64, run it inside ``float64_throughout``,
within which the name ``torch.float32`` of ``modeling_diffllama`` means float64; they report how far the module as
shipped is, in a note. In float32 the module runs exactly as given.
"""

from __future__ import annotations

import math
from contextlib import contextmanager, nullcontext
from typing import TYPE_CHECKING

import numpy as np

from .. import masks as M
from ..attention import MultiHeadAttention
from ..kv_cache import KVCache
from ._harness import add_grad_rows, decode_calls, random_like
from ._lazy import require
from .llama import from_llama_like, llama_like_sizes, torch_cos_sin
from .names import HF_LLAMA_NAME_MAP, NameMap, params_from_state
from .report import CrosscheckReport, rtol_for

if TYPE_CHECKING:  # annotations only
    from transformers.models.diffllama.modeling_diffllama import DiffLlamaAttention

LAMBDAS = ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2")
HF_DIFFLLAMA_NAME_MAP: NameMap = {**HF_LLAMA_NAME_MAP, **{name: (name, None) for name in LAMBDAS}}
"""DiffLlamaAttention's parameters as ours (the biases exist only with ``attention_bias=True``)."""


def from_hf_diffllama_attention(module: DiffLlamaAttention) -> MultiHeadAttention:
    """Hugging Face ``DiffLlamaAttention`` -> ``MultiHeadAttention(diff_attention=True, ...)``, the same weights.

    Self-attention with E = hidden_size and the config's head_dim, GQA from ``num_key_value_heads``, RoPE from the
    config, λ_init from ``layer_idx``, the pair norm's eps from ``groupnorm``. Causality is not part of the module:
    pass ``masks.causal_mask(L)`` (or use a ``KVCache``), as DiffLlamaModel's mask does.
    """
    d = llama_like_sizes(module, "DiffLlamaAttention", needs=("groupnorm", *LAMBDAS))[-1]
    layer = module.layer_idx
    if not isinstance(layer, int) or not math.isclose(module.lambda_init, 0.8 - 0.6 * math.exp(-0.3 * layer)):
        raise ValueError(f"lambda_init={module.lambda_init} is not 0.8 - 0.6 exp(-0.3 layer_idx), layer_idx={layer}")
    norm = module.groupnorm
    if norm.weight is not None or norm.eps is None or tuple(norm.normalized_shape) != (2 * d,):
        raise ValueError(f"groupnorm must be an RMSNorm over 2·head_dim = {2 * d} without weight and with eps: {norm}")
    return from_llama_like(module, "DiffLlamaAttention", HF_DIFFLLAMA_NAME_MAP, diff_attention=True,
                           diff_layer_idx=layer, diff_norm_eps=float(norm.eps))  # fmt: skip


class _Float32IsFloat64:
    """``torch`` as ``modeling_diffllama`` sees it inside ``float64_throughout``: the same, but float32 is float64."""

    def __init__(self, torch) -> None:
        self.__dict__["torch"] = torch

    def __getattr__(self, name: str):
        torch = self.__dict__["torch"]
        return torch.float64 if name == "float32" else getattr(torch, name)


@contextmanager
def float64_throughout():
    """Within the block, Hugging Face's DiffLlama takes its eager softmax and λ's dot products in float64 instead of
    float32: the name ``torch.float32``, which those two casts (and DiffLlamaRMSNorm's) read from the module
    ``modeling_diffllama``, means ``torch.float64`` there. Nothing else changes; restored afterwards. Process-wide
    while it lasts (not for threads running DiffLlama in float32 meanwhile). The rotary module's angles are not
    covered (it asks for ``torch.float``): the cross-checks give the attention float64 (cos, sin) themselves."""
    torch = require("torch")
    from transformers.models.diffllama import modeling_diffllama

    modeling_diffllama.torch = _Float32IsFloat64(torch)
    try:
        yield
    finally:
        modeling_diffllama.torch = torch


def _bool_mask(attention_mask, B: int, L: int) -> np.ndarray:
    """Causal and, with a Hugging Face ``attention_mask`` (B, L) (1 = keep), padding: (B, 1, L, L), True = attend."""
    causal = M.causal_mask(L)
    if attention_mask is None:
        return np.broadcast_to(causal, (B, 1, L, L))
    mask = M.combine_masks(causal, M.padding_mask(attention_mask=attention_mask))  # (B, 1, L, L)
    if not mask.any(axis=-1).all():
        raise ValueError(
            "attention_mask leaves a query without any key (left padding?): HF's softmax then gives uniform weights "
            "or NaN where ours gives 0; pad on the right"
        )
    return mask


def _run_hf(torch, module, x, cos_sin, mask, d_output):
    """-> (output, attention weights, gradients of x and of each named parameter) of HF's module, autograd."""
    tx = torch.from_numpy(np.ascontiguousarray(x)).requires_grad_()
    named = dict(module.named_parameters())
    additive = torch.from_numpy(np.ascontiguousarray(M.to_additive(mask, x.dtype)))  # (B, 1, L, L), 0 / -inf
    out, weights = module(tx, cos_sin, additive)
    grads = torch.autograd.grad(out, [tx, *named.values()], torch.from_numpy(d_output))
    return out.detach().numpy(), weights.detach().numpy(), grads[0].numpy(), dict(zip(named, grads[1:]))


def _rope_note(torch, module, positions: np.ndarray, cos_t) -> str:
    """How far HF's own rotary module (float32 angles) is from the float64 (cos, sin) given to the attention."""
    from transformers.models.diffllama.modeling_diffllama import DiffLlamaRotaryEmbedding

    cos_hf, _ = DiffLlamaRotaryEmbedding(module.config)(
        torch.zeros(1, dtype=torch.float64), torch.from_numpy(positions)
    )
    err = float((cos_hf.double() - cos_t.double()).abs().max())
    return f"HF's DiffLlamaRotaryEmbedding (float32 angles) differs from the float64 cos by {err:.1e}; not used here"


def crosscheck_hf_diffllama_attention(
    module: DiffLlamaAttention,
    hidden_states: np.ndarray,
    attention_mask: np.ndarray | None = None,
    d_output: np.ndarray | None = None,
    rng: int | np.random.Generator | None = 0,
    rtol: float | None = None,
    kernel="vectorized",
) -> CrosscheckReport:
    """A transformers ``DiffLlamaAttention`` (causal) against ``from_hf_diffllama_attention(module)`` on ``kernel``.

    hidden_states (B, L, E) NumPy; attention_mask (B, L) Hugging Face style (1 = keep; every query must see a key:
    pad on the right), default none. HF gets float64 (cos, sin) built with torch ops and the causal (and padding)
    mask as an additive float mask; in float64 it runs inside ``float64_throughout``. Rows: the output, the
    attention weights (HF's: the H softmax maps of its first call), and the gradient of a random upstream gradient
    with respect to the input and every parameter, the four λ vectors included.
    """
    torch = require("torch")
    mha = from_hf_diffllama_attention(module)
    mha.kernel = kernel
    dtype, H, d = mha.dtype, mha.num_heads, mha.head_dim
    rtol = rtol_for(dtype, rtol)
    x = np.asarray(hidden_states).astype(dtype, copy=False)
    B, L, E = x.shape
    mask = _bool_mask(attention_mask, B, L)
    d_output = random_like((B, L, E), dtype, rng) if d_output is None else np.asarray(d_output, dtype=dtype)

    out, cache = mha.forward(x, x, x, mask=mask)
    grads = mha.backward(d_output, cache)

    pos = np.broadcast_to(np.arange(L), (B, L)).astype(np.int64)
    cos_sin = torch_cos_sin(torch, pos, d, mha.rope_theta, dtype)
    was_training = module.training
    module.eval()
    try:
        shipped = _run_hf(torch, module, x, cos_sin, mask, d_output)
        if dtype == np.float64:
            with float64_throughout():
                theirs = _run_hf(torch, module, x, cos_sin, mask, d_output)
        else:
            theirs = shipped
    finally:
        module.train(was_training)
    out_t, weights_t, dx_t, grads_t = theirs

    title = (f"transformers DiffLlamaAttention (H={H}, Hkv={mha.num_kv_heads}, layer_idx={mha.diff_layer_idx}, "
             f"{module.config._attn_implementation}) on {mha.kernel.name}")  # fmt: skip
    report = CrosscheckReport(title, dtype, rtol)
    report.compare("output", "module(x, (cos, sin), mask)", out, out_t)
    report.compare("attention weights", "its returned attn_weights", cache.attn_weights, weights_t)
    report.compare("dL/dx (q+k+v paths)", "hidden_states.grad", grads["query"] + grads["key"] + grads["value"], dx_t)
    name_map = {ours: entry for ours, entry in HF_DIFFLLAMA_NAME_MAP.items() if ours in mha.params}
    grads_theirs = params_from_state({n: g.numpy() for n, g in grads_t.items()}, name_map)
    add_grad_rows(report, grads, grads_theirs, name_map)
    real = B * L if attention_mask is None else int(np.sum(attention_mask))
    report.notes.append(f"batch {B} x {L} tokens ({real} real), causal, random upstream gradient")
    report.notes.append(_rope_note(torch, module, pos, cos_sin[0]))
    if dtype == np.float64:
        err_y = np.abs(shipped[0] - out).max() / np.abs(shipped[0]).max()
        err_w = np.abs(shipped[1] - cache.attn_weights).max() / np.abs(shipped[1]).max()
        report.notes.append(
            f"HF run with its softmax and λ in float64 (float64_throughout); as shipped (both in float32) it differs "
            f"from ours by {err_y:.1e} (output) and {err_w:.1e} (weights), relative to the largest"
        )
    return report


def crosscheck_hf_diffllama_kv_cache(
    module: DiffLlamaAttention,
    hidden_states: np.ndarray,
    prefill: int = 3,
    rtol: float | None = None,
    kernel="vectorized",
) -> CrosscheckReport:
    """Decoding with a cache: ours (``KVCache``) against ``DiffLlamaAttention`` with a transformers ``DynamicCache``.

    hidden_states (B, L, E): the first ``prefill`` tokens in one call, then one token per call. Rows: the outputs
    of every call (concatenated, (B, L, E)) against HF's cached decoding; ours cached against our own full causal
    forward; the cached keys (after RoPE) and values (d wide: the pairing happens after the cache) against HF's.
    """
    torch = require("torch")
    from transformers import DynamicCache

    mha = from_hf_diffllama_attention(module)
    mha.kernel = kernel
    dtype, d = mha.dtype, mha.head_dim
    rtol = rtol_for(dtype, rtol)
    x = np.asarray(hidden_states).astype(dtype, copy=False)
    B, L, E = x.shape
    calls = decode_calls(L, prefill)

    kv = KVCache()
    ours = np.concatenate([mha.forward(x[:, a:b], x[:, a:b], x[:, a:b], kv_cache=kv)[0] for a, b in calls], axis=1)
    full, _ = mha.forward(x, x, x, mask=M.causal_mask(L))

    hf_cache = DynamicCache(config=module.config)
    cos_t, sin_t = torch_cos_sin(torch, np.broadcast_to(np.arange(L), (B, L)), d, mha.rope_theta, dtype)
    tx, theirs = torch.from_numpy(np.ascontiguousarray(x)), []
    was_training = module.training
    module.eval()
    try:
        with torch.no_grad(), float64_throughout() if dtype == np.float64 else nullcontext():
            for a, b in calls:
                causal = torch.from_numpy(M.to_additive(M.causal_mask(b - a, b, diagonal=a), dtype)[None, None])
                theirs.append(module(tx[:, a:b], (cos_t[:, a:b], sin_t[:, a:b]), causal, cache=hf_cache)[0].numpy())
    finally:
        module.train(was_training)
    layer = hf_cache.layers[module.layer_idx]

    report = CrosscheckReport(
        f"KV cache vs transformers DynamicCache (prefill {prefill}, then {L - prefill} single steps), "
        f"differential attention on {mha.kernel.name}",
        dtype,
        rtol,
    )
    report.compare("outputs, every call", "DiffLlamaAttention(..., cache=)", ours, np.concatenate(theirs, axis=1))
    report.compare("cached ≡ full causal", "ours, one causal forward", ours, full, note="ours vs ours")
    report.compare("cached keys (RoPE'd)", "DynamicCache keys", kv.keys, layer.keys.numpy())
    report.compare("cached values", "DynamicCache values", kv.values, layer.values.numpy())
    return report


def hf_diffllama_attention(
    hidden_size: int = 16,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    rope_theta: float = 10000.0,
    bias: bool = False,
    layer_idx: int = 2,
    dtype=np.float64,
    seed: int = 0,
    head_dim: int | None = None,
    lambda_std_dev: float = 0.3,
) -> DiffLlamaAttention:
    """A small random transformers ``DiffLlamaAttention`` (eager) for the cross-checks, built locally.

    Nonzero biases when ``bias``; λ's vectors drawn from N(0, lambda_std_dev²) (DiffLlama's default 0.1 leaves λ
    within a few percent of λ_init); layer ``layer_idx`` of a config with layer_idx + 1 layers (for its cache).
    """
    torch = require("torch")
    require("transformers")
    from transformers import DiffLlamaConfig
    from transformers.models.diffllama.modeling_diffllama import DiffLlamaAttention

    cfg = DiffLlamaConfig(
        hidden_size=hidden_size, num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
        intermediate_size=2 * hidden_size, num_hidden_layers=layer_idx + 1, vocab_size=16, rope_theta=rope_theta,
        attention_bias=bias, attn_implementation="eager", head_dim=head_dim or hidden_size // num_heads,
        lambda_std_dev=lambda_std_dev,
    )  # fmt: skip
    torch.manual_seed(seed)
    module = DiffLlamaAttention(cfg, layer_idx=layer_idx).to(getattr(torch, np.dtype(dtype).name))
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("bias"):
                p.normal_(0.0, 0.1)  # zero biases would hide bias bugs
    return module
