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
from functools import partial
from typing import TYPE_CHECKING

import numpy as np

from .. import masks as M
from ..attention import MultiHeadAttention
from ..kv_cache import KVCache
from ._lazy import require
from .harness import (
    Row,
    additive_tensor,
    compare,
    decode,
    decode_calls,
    decoding_rows,
    grad_rows,
    hf_decode,
    positions_of,
    relative,
    run_hf_attention,
    run_ours,
    upstream,
)
from .llama import causal_call_mask, from_llama_like, hidden, llama_like_sizes, rope_note, torch_cos_sin
from .names import HF_LLAMA_NAME_MAP, NameMap
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


def _imported(module, kernel) -> MultiHeadAttention:
    """``from_hf_diffllama_attention(module)`` on ``kernel``."""
    mha = from_hf_diffllama_attention(module)
    mha.kernel = kernel
    return mha


ROWS = (
    Row("output", "module(x, (cos, sin), mask)", "output"),
    Row("attention weights", "its returned attn_weights", "weights"),
    Row("dL/dx (q+k+v paths)", "hidden_states.grad", "dx"),
)
"""The rows of ``crosscheck_hf_diffllama_attention`` before the gradients of the parameters."""


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
    from transformers.models.diffllama.modeling_diffllama import DiffLlamaRotaryEmbedding

    mha = _imported(module, kernel)
    dtype, x = mha.dtype, hidden(hidden_states, mha.dtype)
    (B, L, _), pos = x.shape, positions_of(None, *x.shape[:2])
    mask, d_output = _bool_mask(attention_mask, B, L), upstream(d_output, x.shape, dtype, rng)
    ours, _ = run_ours(mha, (x, x, x), d_output, mask=mask)
    cos_sin = torch_cos_sin(torch, pos, mha.head_dim, mha.rope_theta, dtype)
    name_map = {n: entry for n, entry in HF_DIFFLLAMA_NAME_MAP.items() if n in mha.params}
    shipped, theirs = _hf_calls(torch, module, x, cos_sin, additive_tensor(torch, mask, dtype), d_output, name_map)
    title = (f"transformers DiffLlamaAttention (H={mha.num_heads}, Hkv={mha.num_kv_heads}, "
             f"layer_idx={mha.diff_layer_idx}, {module.config._attn_implementation}) on {mha.kernel.name}")  # fmt: skip
    real = B * L if attention_mask is None else int(np.sum(attention_mask))
    notes = [f"batch {B} x {L} tokens ({real} real), causal, random upstream gradient",
             rope_note(torch, DiffLlamaRotaryEmbedding, module.config, pos, cos_sin[0])]  # fmt: skip
    if dtype == np.float64:
        err_y, err_w = relative(ours["output"], shipped["output"]), relative(ours["weights"], shipped["weights"])
        notes.append(
            f"HF run with its softmax and λ in float64 (float64_throughout); as shipped (both in float32) it differs "
            f"from ours by {err_y:.1e} (output) and {err_w:.1e} (weights), relative to the largest"
        )
    return compare(title, dtype, rtol_for(dtype, rtol), ROWS + grad_rows(name_map), ours, theirs, notes)


def _hf_calls(torch, module, x, cos_sin, mask_t, d_output, name_map) -> tuple[dict, dict]:
    """``run_hf_attention`` as shipped, and the compared run: in float64 inside ``float64_throughout``, in float32
    the same."""
    shipped = run_hf_attention(torch, module, x, cos_sin, mask_t, d_output, name_map)
    if x.dtype != np.float64:
        return shipped, shipped
    with float64_throughout():
        return shipped, run_hf_attention(torch, module, x, cos_sin, mask_t, d_output, name_map)


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
    mha = _imported(module, kernel)
    dtype, x = mha.dtype, hidden(hidden_states, mha.dtype)
    B, L, E = x.shape
    calls, kv = decode_calls(L, prefill), KVCache()
    ours = {"outputs": decode(calls, lambda a, b: mha.forward(*(x[:, a:b],) * 3, kv_cache=kv)[0])}
    ours.update(full=mha.forward(x, x, x, mask=M.causal_mask(L))[0], keys=kv.keys, values=kv.values)
    cos_sin = torch_cos_sin(torch, positions_of(None, B, L), mha.head_dim, mha.rope_theta, dtype)
    context = float64_throughout if dtype == np.float64 else nullcontext
    outputs, layer = hf_decode(torch, module, x, calls, cos_sin, partial(causal_call_mask, torch, dtype), context)
    theirs = {"outputs": outputs, "keys": layer.keys.numpy(), "values": layer.values.numpy()}
    title = (f"KV cache vs transformers DynamicCache (prefill {prefill}, then {L - prefill} single steps), "
             f"differential attention on {mha.kernel.name}")  # fmt: skip
    rows = decoding_rows("DiffLlamaAttention(..., cache=)")
    return compare(title, dtype, rtol_for(dtype, rtol), rows, ours, theirs)


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
