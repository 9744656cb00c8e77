"""PyTorch and Hugging Face interop: weight import/export, mask conversion, and cross-checks.

torch and transformers are imported lazily, inside the functions that need them: ``import mha_numpy``
(and even ``import mha_numpy.torch_compat``) works without them, and a call that needs one raises an
``ImportError`` naming the missing package.

The name maps (which torch tensor holds which of our parameters) are plain data, so they can be read,
documented and tested without torch (``torch_mha_name_map``, ``HF_BERT_NAME_MAP``, ``params_from_state``).
For torch.nn.MultiheadAttention with E = embed_dim:

===========  ==================================  ====================  ===============================
ours         torch MHA, packed (kdim = vdim = E)  torch MHA, separate   HF BertAttention
===========  ==================================  ====================  ===============================
W_q (E, E)   in_proj_weight[0:E]                 q_proj_weight         self.query.weight
W_k (E, kd)  in_proj_weight[E:2E]                k_proj_weight         self.key.weight
W_v (E, vd)  in_proj_weight[2E:3E]               v_proj_weight         self.value.weight
b_q, b_k,    in_proj_bias[0:E], [E:2E], [2E:3E]  (same, packed bias)   self.query.bias, ...
b_v (E,)
W_o (E, E)   out_proj.weight                     out_proj.weight       output.dense.weight
b_o (E,)     out_proj.bias                       out_proj.bias         output.dense.bias
===========  ==================================  ====================  ===============================

The cross-checks (``crosscheck_torch_mha``, ``crosscheck_sdpa``, ``crosscheck_hf_bert_attention``) run the
same weights and inputs through both frameworks and return a ``CrosscheckReport`` that prints as a table:
the output, the attention weights, the intermediates Q, K, V, scores and context, and the gradient of a
random upstream gradient with respect to every input and every parameter. See docs/crosscheck.md.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from .. import functional as F
from .. import masks as M
from ..attention import MultiHeadAttention

if TYPE_CHECKING:  # for the annotations only: never imported at run time here
    import torch
    from transformers.models.bert.modeling_bert import BertAttention

# --------------------------------------------------------------------------- lazy imports


def _require(package: str):
    """Import ``package`` (torch or transformers) or raise an ImportError that names it."""
    try:
        return importlib.import_module(package)
    except ImportError as exc:
        top = package.split(".")[0]
        raise ImportError(
            f"this function of mha_numpy.torch_compat needs the '{top}' package, which is not installed; "
            f"install it with `pip install {top}` (or `pip install -r requirements-dev.txt`)"
        ) from exc


def _to_numpy(x) -> np.ndarray | None:
    """A torch tensor or array-like -> ndarray (a copy for tensors); None stays None."""
    if x is None:
        return None
    if hasattr(x, "detach"):  # a torch tensor
        return x.detach().cpu().numpy().copy()
    return np.asarray(x)


# --------------------------------------------------------------------------- name maps (pure data)

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


def torch_mha_name_map(embed_dim: int, packed: bool = True, bias: bool = True) -> NameMap:
    """Where each of our parameters lives in a ``torch.nn.MultiheadAttention`` state dict.

    packed (kdim == vdim == embed_dim): W_q, W_k, W_v are the row blocks [0:E], [E:2E], [2E:3E] of
    ``in_proj_weight`` (3E, E). Otherwise they are ``q_proj_weight`` (E, E), ``k_proj_weight`` (E, kdim),
    ``v_proj_weight`` (E, vdim). The input biases are always the blocks of ``in_proj_bias`` (3E,).
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
        full = _to_numpy(state[torch_name])
        out[ours] = np.array(full if rows is None else full[rows], copy=True)
    return out


# --------------------------------------------------------------------------- modules


def _check_numpy_dtype(torch_dtype) -> np.dtype:
    name = str(torch_dtype).removeprefix("torch.")
    if name not in ("float16", "float32", "float64"):
        raise ValueError(f"the module's dtype is {torch_dtype}; mha_numpy supports float16, float32 and float64")
    return np.dtype(name)


def _new_mha(E, H, bias, kdim, vdim, dropout, dtype, params) -> MultiHeadAttention:
    mha = MultiHeadAttention(E, H, bias=bias, kdim=kdim, vdim=vdim, dropout=dropout, dtype=dtype, rng=0)
    for name, p in mha.params.items():
        if params[name].shape != p.shape:
            raise ValueError(f"{name}: the imported tensor has shape {params[name].shape}, expected {p.shape}")
    mha.params = {name: params[name] for name in mha.params}  # same keys and order as a fresh module
    return mha


def from_torch_mha(module: torch.nn.MultiheadAttention) -> MultiHeadAttention:
    """``torch.nn.MultiheadAttention`` -> ``MultiHeadAttention`` with copies of the same weights.

    Packed ``in_proj_weight`` or separate ``q/k/v_proj_weight`` (kdim / vdim), with or without bias,
    either ``batch_first`` (our arrays are always (B, L, E)); the dtype follows the module.
    ``add_bias_kv`` and ``add_zero_attn`` change the keys themselves and are refused.
    """
    torch = _require("torch")
    if not isinstance(module, torch.nn.MultiheadAttention):
        raise ValueError(f"module must be a torch.nn.MultiheadAttention, got {type(module).__name__}")
    if module.bias_k is not None or module.bias_v is not None:
        raise ValueError("add_bias_kv=True appends learned bias_k/bias_v as an extra key; mha_numpy does not model it")
    if module.add_zero_attn:
        raise ValueError("add_zero_attn=True appends a zero key/value; mha_numpy does not model it")
    bias = module.in_proj_bias is not None
    if bias != (module.out_proj.bias is not None):
        raise ValueError("in_proj_bias and out_proj.bias must both be present or both absent")
    packed = bool(module._qkv_same_embed_dim)
    dtype = _check_numpy_dtype(module.out_proj.weight.dtype)
    name_map = torch_mha_name_map(module.embed_dim, packed=packed, bias=bias)
    params = params_from_state(dict(module.named_parameters()), name_map)
    return _new_mha(module.embed_dim, module.num_heads, bias, module.kdim, module.vdim, module.dropout, dtype, params)


def to_torch_mha(mha: MultiHeadAttention) -> torch.nn.MultiheadAttention:
    """``MultiHeadAttention`` -> ``torch.nn.MultiheadAttention(batch_first=True)`` with the same weights.

    Packed ``in_proj_weight`` when kdim == vdim == E (torch decides this), separate weights otherwise.
    The dtype follows ``mha``; values are copied exactly.
    """
    torch = _require("torch")
    module = torch.nn.MultiheadAttention(
        mha.embed_dim,
        mha.num_heads,
        dropout=mha.dropout,
        bias=mha.bias,
        kdim=mha.kdim,
        vdim=mha.vdim,
        batch_first=True,
        dtype=getattr(torch, mha.dtype.name),
    )
    named = dict(module.named_parameters())
    with torch.no_grad():
        for ours, (torch_name, rows) in torch_mha_name_map(mha.embed_dim, module._qkv_same_embed_dim, mha.bias).items():
            target = named[torch_name] if rows is None else named[torch_name][rows]
            if tuple(target.shape) != mha.params[ours].shape:
                raise ValueError(f"{ours} has shape {mha.params[ours].shape}, torch expects {tuple(target.shape)}")
            target.copy_(torch.from_numpy(mha.params[ours]))
    return module


def from_hf_bert_attention(module: BertAttention) -> MultiHeadAttention:
    """Hugging Face ``BertAttention`` -> ``MultiHeadAttention`` (self.query/key/value and output.dense).

    Only multi-head attention is imported. ``BertSelfOutput`` (``module.output``) then adds the input
    back and applies ``LayerNorm``: ``LayerNorm(dense(context) + hidden_states)``. That residual and
    LayerNorm are not part of MHA and not modelled here (``crosscheck_hf_bert_attention`` checks them
    separately, forward only, with a NumPy LayerNorm).
    """
    self_attn = getattr(module, "self", None)
    if self_attn is None or not all(hasattr(self_attn, n) for n in ("query", "key", "value")):
        raise ValueError(f"module must be a transformers BertAttention (with .self.query/key/value), got {module!r}")
    E = self_attn.query.in_features
    H = self_attn.num_attention_heads
    if self_attn.all_head_size != E:
        raise ValueError(f"all_head_size={self_attn.all_head_size} differs from hidden_size={E}; not modelled")
    scaling = getattr(self_attn, "scaling", self_attn.attention_head_size**-0.5)  # older transformers: implicit
    if not np.isclose(scaling, self_attn.attention_head_size**-0.5, rtol=1e-15):
        raise ValueError(f"BertSelfAttention.scaling={scaling} is not 1/sqrt(head size); not modelled")
    dtype = _check_numpy_dtype(self_attn.query.weight.dtype)
    params = params_from_state(dict(module.named_parameters()), HF_BERT_NAME_MAP)
    return _new_mha(E, H, True, E, E, float(self_attn.dropout.p), dtype, params)


# --------------------------------------------------------------------------- masks (tensors or arrays)


def mask_from_torch_mha(key_padding_mask=None, attn_mask=None, num_heads: int | None = None) -> np.ndarray | None:
    """torch MHA masks (bool True = **ignore**, or float added) -> one mask of ours (True = may attend).

    key_padding_mask (B, Lk); attn_mask (Lq, Lk) or (B*H, Lq, Lk) (needs ``num_heads``). Tensors or arrays.
    """
    parts = []
    if key_padding_mask is not None:
        parts.append(M.from_torch_key_padding_mask(_to_numpy(key_padding_mask)))  # (B, 1, 1, Lk)
    if attn_mask is not None:
        parts.append(M.from_torch_attn_mask(_to_numpy(attn_mask), num_heads))  # (Lq, Lk) or (B, H, Lq, Lk)
    return M.combine_masks(*parts)


def mask_to_torch_mha(mask, batch_size: int, num_heads: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Our mask -> ``(key_padding_mask, attn_mask)`` torch tensors for ``torch.nn.MultiheadAttention``.

    A key padding mask (B, 1, 1, Lk) becomes ``key_padding_mask`` (B, Lk); a mask shared by the batch
    ((Lq, Lk) or (1, 1, Lq, Lk)) becomes a 2-D ``attn_mask``; anything else a (B*H, Lq, Lk) ``attn_mask``.
    Bool True = may attend becomes True = ignore; float masks are kept.
    """
    torch = _require("torch")
    if mask is None:
        return None, None
    m = np.asarray(mask)
    if m.ndim == 4 and m.shape[1:3] == (1, 1):
        kpm = M.to_torch_key_padding_mask(np.broadcast_to(m, (batch_size, 1, 1, m.shape[3])))  # (B, Lk)
        return torch.from_numpy(np.ascontiguousarray(kpm)), None
    if m.ndim == 4 and m.shape[:2] == (1, 1):
        m = m[0, 0]  # (Lq, Lk)
    if m.ndim == 2:
        return None, torch.from_numpy(np.ascontiguousarray(M.to_torch_attn_mask(m)))  # (Lq, Lk)
    if m.ndim != 4:
        raise ValueError(f"mask must be (Lq, Lk) or 4-D broadcastable to (B, H, Lq, Lk), got shape {m.shape}")
    attn = M.to_torch_attn_mask(m, batch_size, num_heads)  # (B*H, Lq, Lk)
    return None, torch.from_numpy(np.ascontiguousarray(attn))


def mask_from_sdpa(attn_mask) -> np.ndarray | None:
    """SDPA ``attn_mask`` (bool True = attend, float added) -> ours (the same convention)."""
    return None if attn_mask is None else M.from_sdpa_mask(_to_numpy(attn_mask))


def mask_to_sdpa(mask) -> torch.Tensor | None:
    """Our mask -> an SDPA ``attn_mask`` tensor (the same convention)."""
    torch = _require("torch")
    return None if mask is None else torch.from_numpy(np.ascontiguousarray(M.to_sdpa_mask(mask)))


def mask_from_hf(attention_mask) -> np.ndarray | None:
    """HF ``attention_mask`` (B, Lk) with 1 = keep, or HF's 4-D additive extended mask -> ours (bool)."""
    if attention_mask is None:
        return None
    am = _to_numpy(attention_mask)
    if am.ndim == 4:
        return M.from_hf_extended_mask(am)
    return M.from_hf_attention_mask(am)  # (B, 1, 1, Lk)


def mask_to_hf(mask) -> torch.Tensor | None:
    """Our key padding mask (B, 1, 1, Lk) -> HF ``attention_mask`` (B, Lk) int64 tensor, 1 = keep."""
    torch = _require("torch")
    return None if mask is None else torch.from_numpy(M.to_hf_attention_mask(mask))


# --------------------------------------------------------------------------- the report


DEFAULT_RTOL = {np.dtype(np.float64): 1e-10, np.dtype(np.float32): 1e-5}


def _rtol_for(dtype, rtol: float | None) -> float:
    """The pass threshold: ``rtol`` or the default of the dtype; refuses dtypes other than float32/64."""
    dtype = np.dtype(dtype)
    if dtype not in DEFAULT_RTOL:
        raise ValueError(f"cross-checks run in float32 or float64, got {dtype}")
    return DEFAULT_RTOL[dtype] if rtol is None else float(rtol)


@dataclass
class CrosscheckRow:
    """One named quantity, ours against the other framework's."""

    name: str
    theirs: str  # where the other side's number comes from
    shape: tuple
    max_abs_err: float
    max_rel_err: float  # max |ours - theirs| / max |theirs|: relative to the tensor's scale
    passed: bool
    zero: bool = False  # both sides are 0 to within zero_atol (e.g. dL/db_k): judged on the abs error
    note: str = ""


@dataclass
class CrosscheckReport:
    """A table of CrosscheckRow. ``passed`` is True when every row passes."""

    title: str
    dtype: np.dtype
    rtol: float
    rows: list[CrosscheckRow] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.dtype = np.dtype(self.dtype)
        _rtol_for(self.dtype, self.rtol)  # float32 / float64 only: zero_atol is 1000 ulp of the dtype

    @property
    def zero_atol(self) -> float:
        """Below this both sides count as an exact 0 (1000 ulp at 1)."""
        return 1000 * float(np.finfo(self.dtype).eps)

    @property
    def passed(self) -> bool:
        return bool(self.rows) and all(r.passed for r in self.rows)

    def __getitem__(self, name: str) -> CrosscheckRow:
        for r in self.rows:
            if r.name == name:
                return r
        raise KeyError(f"{name!r}; rows are {[r.name for r in self.rows]}")

    def compare(self, name: str, theirs_label: str, ours, theirs, note: str = "") -> CrosscheckRow:
        a, b = np.asarray(ours, dtype=np.float64), np.asarray(theirs, dtype=np.float64)
        if a.shape != b.shape:
            raise ValueError(f"{name}: ours has shape {a.shape}, {theirs_label} has shape {b.shape}")
        bad_a, bad_b = int((~np.isfinite(a)).sum()), int((~np.isfinite(b)).sum())
        if bad_a or bad_b:
            row = CrosscheckRow(name, theirs_label, a.shape, np.nan, np.nan, False, note=note)
            row.note = f"non-finite entries: ours {bad_a}, theirs {bad_b}" + (f"; {note}" if note else "")
        else:
            err = float(np.abs(a - b).max()) if a.size else 0.0
            scale = float(np.abs(b).max()) if b.size else 0.0
            zero = max(scale, float(np.abs(a).max()) if a.size else 0.0) <= self.zero_atol
            rel = 0.0 if zero else (err / scale if scale > 0 else np.inf)
            passed = err <= self.zero_atol if zero else rel <= self.rtol
            row = CrosscheckRow(name, theirs_label, a.shape, err, rel, passed, zero, note)
        self.rows.append(row)
        return row

    def __str__(self) -> str:
        w = max([22, *(len(r.name) for r in self.rows)])
        head = f"{'quantity':<{w}} {'theirs':<34} {'shape':<15} {'max abs err':>11} {'max rel err':>11}  ok"
        lines = [f"{self.title}  [{self.dtype.name}, pass: max rel err <= {self.rtol:g}]", head, "-" * len(head)]
        for r in self.rows:
            rel = "  zero grad" if r.zero else f"{r.max_rel_err:11.2e}"
            lines.append(
                f"{r.name:<{w}} {r.theirs:<34} {str(r.shape):<15} {r.max_abs_err:11.2e} {rel:>11}  "
                f"{'PASS' if r.passed else 'FAIL'}" + (f"  ({r.note})" if r.note else "")
            )
        lines += self.notes
        if any(r.zero for r in self.rows):
            lines.append(f"zero grad: exactly 0 in theory, both sides <= {self.zero_atol:.1e}; judged on the abs error")
        lines.append(f"RESULT: {'PASS' if self.passed else 'FAIL'}")
        return "\n".join(lines)


def _random_like(shape, dtype, rng) -> np.ndarray:
    gen = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
    return gen.standard_normal(shape).astype(dtype)


def _heads(torch_x, num_heads: int):
    """torch (B, L, E) -> (B, H, L, d), the same split as ours (head h = features h*d ... (h+1)*d - 1)."""
    B, L, E = torch_x.shape
    return torch_x.reshape(B, L, num_heads, E // num_heads).transpose(1, 2)  # (B, H, L, d)


def _torch_attention(torch, Q, K, V, scale: float, additive):
    """Torch ops: scores = (Q scale) Kᵀ, weights = softmax(scores + mask), context = weights V.

    Fully masked rows: torch's softmax gives NaN; set to 0 like SDPA and mha_numpy do.
    """
    scores = (Q * scale) @ K.transpose(-2, -1)  # (B, H, Lq, Lk), torch MHA's order: scale q first
    masked = scores if additive is None else scores + additive
    weights = torch.softmax(masked, dim=-1).nan_to_num(0.0)  # (B, H, Lq, Lk)
    return scores, weights, weights @ V  # context (B, H, Lq, d)


def _additive_tensor(torch, mask, dtype):
    return None if mask is None else torch.from_numpy(np.ascontiguousarray(M.to_additive(mask, dtype)))


def _add_grad_rows(report, grads_ours: dict, grads_theirs: dict, name_map: NameMap) -> None:
    for ours in name_map:
        report.compare(f"dL/d{ours}", describe(name_map[ours]), grads_ours[ours], grads_theirs[ours])


# --------------------------------------------------------------------------- torch.nn.MultiheadAttention


def crosscheck_torch_mha(
    module: torch.nn.MultiheadAttention | MultiHeadAttention,
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    key_padding_mask=None,
    attn_mask=None,
    need_weights: bool = True,
    d_output: np.ndarray | None = None,
    rng: int | np.random.Generator | None = 0,
    rtol: float | None = None,
) -> CrosscheckReport:
    """Run ``module`` (a torch.nn.MultiheadAttention, or our MultiHeadAttention exported with
    ``to_torch_mha``) and ``from_torch_mha(module)`` on the same inputs; compare everything.

    query (B, Lq, E), key (B, Lk, kdim), value (B, Lk, vdim): NumPy, always batch first (transposed for a
    ``batch_first=False`` module). Pass the same array three times for self-attention: torch then gets one
    tensor, and dL/dx is compared with our grads["query"] + grads["key"] + grads["value"].
    key_padding_mask (B, Lk) / attn_mask (Lq, Lk) or (B*H, Lq, Lk): in **torch's** convention (True = ignore).
    need_weights: which of torch's two code paths to check. d_output defaults to a random (B, Lq, E).
    rtol defaults to 1e-10 (float64) / 1e-5 (float32).
    """
    torch = _require("torch")
    if isinstance(module, MultiHeadAttention):
        module = to_torch_mha(module)
    mha = from_torch_mha(module)
    dtype, H = mha.dtype, mha.num_heads
    rtol = _rtol_for(dtype, rtol)
    self_attention = query is key and key is value
    query, key, value = (np.asarray(x).astype(dtype, copy=False) for x in (query, key, value))
    mask = mask_from_torch_mha(key_padding_mask, attn_mask, num_heads=H)
    if mask is not None and mask.dtype != np.bool_:
        mask = mask.astype(dtype)
    B, Lq, E = query.shape
    d_output = _random_like((B, Lq, E), dtype, rng) if d_output is None else np.asarray(d_output, dtype=dtype)

    # ours
    out, cache = mha.forward(query, key, value, mask=mask)
    grads = mha.backward(d_output, cache)

    # torch: leaves are batch first; a batch_first=False module sees them transposed to (L, B, E)
    def tensor(x):
        return torch.from_numpy(np.ascontiguousarray(x))

    leaves = [tensor(query).requires_grad_()]
    if not self_attention:
        leaves += [tensor(key).requires_grad_(), tensor(value).requires_grad_()]
    tq, tk, tv = (leaves * 3)[:3] if self_attention else leaves
    fed = [t if module.batch_first else t.transpose(0, 1) for t in (tq, tk, tv)]
    if self_attention:
        fed = [fed[0]] * 3  # the same object three times, as a user would call it

    def torch_mask(m):
        m = None if m is None else (m if hasattr(m, "detach") else tensor(np.asarray(m)))
        return m if m is None or m.dtype == torch.bool else m.to(getattr(torch, dtype.name))

    kpm_t, am_t = torch_mask(key_padding_mask), torch_mask(attn_mask)
    named = dict(module.named_parameters())
    was_training = module.training
    module.eval()  # no dropout
    try:
        out_t, w_t = module(
            *fed, key_padding_mask=kpm_t, attn_mask=am_t, need_weights=need_weights, average_attn_weights=False
        )
        out_t = out_t if module.batch_first else out_t.transpose(0, 1)  # (B, Lq, E)
        g = torch.autograd.grad(out_t, leaves + list(named.values()), tensor(d_output))
        with torch.no_grad():
            avg_t = None
            if need_weights:  # the same path again, with weights averaged over the heads: (B, Lq, Lk)
                avg_t = module(*fed, key_padding_mask=kpm_t, attn_mask=am_t, need_weights=True)[1]
            # the intermediates, from torch's own input projection (independent of our name map)
            b = module.in_proj_bias
            if module._qkv_same_embed_dim:
                q_t, k_t, v_t = torch.nn.functional._in_projection_packed(tq, tk, tv, module.in_proj_weight, b)
            else:
                bq, bk, bv = b.chunk(3) if b is not None else (None, None, None)
                w = (module.q_proj_weight, module.k_proj_weight, module.v_proj_weight)
                q_t, k_t, v_t = torch.nn.functional._in_projection(tq, tk, tv, *w, bq, bk, bv)
            Q_t, K_t, V_t = (_heads(x, H) for x in (q_t, k_t, v_t))  # (B, H, L, d)
            scores_t, _, ctx_t = _torch_attention(
                torch, Q_t, K_t, V_t, mha.head_dim**-0.5, _additive_tensor(torch, mask, dtype)
            )
            merged_t = ctx_t.transpose(1, 2).reshape(B, Lq, E)  # (B, Lq, E)
            out_ops_t = torch.nn.functional.linear(merged_t, module.out_proj.weight, module.out_proj.bias)
    finally:
        module.train(was_training)

    path = "need_weights=True" if need_weights else "need_weights=False"
    layout = "separate q/k/v_proj_weight" if not module._qkv_same_embed_dim else "packed in_proj_weight"
    report = CrosscheckReport(
        f"torch.nn.MultiheadAttention ({path}, {layout}, bias={mha.bias}, batch_first={module.batch_first})",
        dtype,
        rtol,
    )
    report.compare("output", "module(...)[0]", out, out_t.detach().numpy())
    if need_weights:
        report.compare("attn_weights per head", "average_attn_weights=False", cache.attn_weights, w_t.detach().numpy())
        report.compare("attn_weights averaged", "average_attn_weights=True", cache.attn_weights.mean(1), avg_t.numpy())
    report.compare("Q", "F._in_projection → heads", cache.Q, Q_t.numpy())
    report.compare("K", "F._in_projection → heads", cache.K, K_t.numpy())
    report.compare("V", "F._in_projection → heads", cache.V, V_t.numpy())
    report.compare("scores", "(Q·scale) Kᵀ  (torch ops)", cache.scores, scores_t.numpy())
    report.compare("context", "softmax(scores+mask) V (torch ops)", cache.context, ctx_t.numpy())
    report.compare(
        "torch ops ≡ module",
        "out_proj(merge(context))",
        out_ops_t.numpy(),
        out_t.detach().numpy(),
        note="torch vs torch: the intermediates are the module's",
    )
    g = [x.numpy() for x in g]
    if self_attention:
        report.compare(
            "dL/dx (q+k+v paths)", "x.grad (one tensor)", grads["query"] + grads["key"] + grads["value"], g[0]
        )
    else:
        for name, gt in zip(("query", "key", "value"), g[:3]):
            report.compare(f"dL/d{name}", f"{name}.grad", grads[name], gt)
    name_map = torch_mha_name_map(mha.embed_dim, module._qkv_same_embed_dim, mha.bias)
    grads_theirs = params_from_state(dict(zip(named, g[len(leaves) :])), name_map)
    _add_grad_rows(report, grads, grads_theirs, name_map)
    return report


# --------------------------------------------------------------------------- torch SDPA


def crosscheck_sdpa(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    attn_mask=None,
    is_causal: bool = False,
    scale: float | None = None,
    d_output: np.ndarray | None = None,
    rng: int | np.random.Generator | None = 0,
    rtol: float | None = None,
) -> CrosscheckReport:
    """``functional.scaled_dot_product_attention`` against ``torch.nn.functional.scaled_dot_product_attention``.

    q (B, H, Lq, d), k (B, H, Lk, d), v (B, H, Lk, dv), NumPy, one dtype. attn_mask in SDPA's convention
    (bool True = attend, or float added), which is ours. is_causal: top-left aligned, like our
    ``masks.causal_mask(Lq, Lk)`` (torch refuses attn_mask together with is_causal; so do we).
    """
    torch = _require("torch")
    q, k, v = (np.asarray(x) for x in (q, k, v))
    dtype = q.dtype
    rtol = _rtol_for(dtype, rtol)
    if attn_mask is not None and is_causal:
        raise ValueError("pass either attn_mask or is_causal=True, not both (torch SDPA refuses both)")
    mask = M.causal_mask(q.shape[2], k.shape[2]) if is_causal else mask_from_sdpa(attn_mask)
    if mask is not None and mask.dtype != np.bool_:
        mask = mask.astype(dtype)
    ctx, cache = F.scaled_dot_product_attention_forward(q, k, v, mask, scale=scale)
    d_output = _random_like(ctx.shape, dtype, rng) if d_output is None else np.asarray(d_output, dtype=dtype)
    dq, dk, dv = F.scaled_dot_product_attention_backward(d_output, cache)

    tq, tk, tv = (torch.from_numpy(np.ascontiguousarray(x)).requires_grad_() for x in (q, k, v))
    tm = None if (mask is None or is_causal) else torch.from_numpy(np.ascontiguousarray(mask))
    out_t = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, attn_mask=tm, is_causal=is_causal, scale=scale)
    g = torch.autograd.grad(out_t, (tq, tk, tv), torch.from_numpy(d_output))
    s = q.shape[-1] ** -0.5 if scale is None else scale
    with torch.no_grad():
        scores_t, weights_t, _ = _torch_attention(torch, tq, tk, tv, s, _additive_tensor(torch, mask, dtype))

    kind = "is_causal=True" if is_causal else ("no mask" if mask is None else f"{mask.dtype.name} attn_mask")
    report = CrosscheckReport(
        f"torch.nn.functional.scaled_dot_product_attention ({kind})",
        dtype,
        rtol,
    )
    report.compare("output (context)", "SDPA(q, k, v)", ctx, out_t.detach().numpy())
    report.compare("attn_weights", "softmax(scores+mask) (torch ops)", cache.attn_weights, weights_t.numpy())
    report.compare("scores", "(q·scale) kᵀ (torch ops)", cache.scores, scores_t.numpy())
    for name, ours, theirs in zip(("q", "k", "v"), (dq, dk, dv), g):
        report.compare(f"dL/d{name}", f"{name}.grad", ours, theirs.numpy())
    return report


# --------------------------------------------------------------------------- Hugging Face BertAttention


def _layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float) -> np.ndarray:
    """LayerNorm over the last axis (forward only; used to check BertSelfOutput, not part of MHA)."""
    mu = x.mean(axis=-1, keepdims=True)  # (B, L, 1)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)  # (B, L, 1), biased like torch
    return (x - mu) / np.sqrt(var + eps) * weight + bias


def crosscheck_hf_bert_attention(
    module: BertAttention,
    hidden_states: np.ndarray,
    attention_mask=None,
    d_output: np.ndarray | None = None,
    rng: int | np.random.Generator | None = 0,
    rtol: float | None = None,
) -> CrosscheckReport:
    """A transformers ``BertAttention`` against ``from_hf_bert_attention(module)``, self-attention.

    hidden_states (B, L, E) NumPy. attention_mask: None; HF's (B, L) with 1 = keep (ours gets it through
    ``mask_from_hf``, HF through transformers' own ``create_bidirectional_mask``); or a 4-D additive mask
    (HF's 0 / finfo.min, or any float bias), which both sides add to the scores as it is. So a fully masked
    row gets HF's uniform weights here; with our bool conversion it would get zeros (docs/crosscheck.md).
    MHA = module.self then module.output.dense; the gradient rows are for that part. The last row checks
    the whole module, LayerNorm(MHA(x) + x), forward only, with a NumPy LayerNorm.
    The module needs ``attn_implementation="eager"`` for its attention weights.
    """
    torch = _require("torch")
    mha = from_hf_bert_attention(module)
    scaling = mha.head_dim**-0.5  # checked against module.self.scaling by from_hf_bert_attention
    dtype, H = mha.dtype, mha.num_heads
    rtol = _rtol_for(dtype, rtol)
    x = np.asarray(hidden_states).astype(dtype, copy=False)
    B, L, E = x.shape
    tx = torch.from_numpy(np.ascontiguousarray(x)).requires_grad_()
    am = _to_numpy(attention_mask)
    if am is not None and am.ndim == 2:
        try:
            from transformers.masking_utils import create_bidirectional_mask as create
        except ImportError:  # transformers before masking_utils
            create = None
        if create is not None:  # transformers' own conversion: (B, 1, L, L) additive, or None if nothing is masked
            extended = create(config=module.self.config, inputs_embeds=tx, attention_mask=torch.from_numpy(am))
        else:  # older transformers: the same 0 / finfo.min mask, made by us
            extended = torch.from_numpy(M.to_hf_extended_mask(M.from_hf_attention_mask(am), dtype))
        mask = M.from_hf_attention_mask(am)  # ours, bool (B, 1, 1, L)
    else:  # HF's 4-D additive mask is added to the scores, exactly like our float masks: use it as it is
        extended = None if am is None else torch.from_numpy(np.ascontiguousarray(am, dtype=dtype))
        mask = None if am is None else am.astype(dtype)
    d_output = _random_like((B, L, E), dtype, rng) if d_output is None else np.asarray(d_output, dtype=dtype)

    out, cache = mha.forward(x, x, x, mask=mask)
    grads = mha.backward(d_output, cache)

    named = {n: p for n, p in module.named_parameters() if n in {t for t, _ in HF_BERT_NAME_MAP.values()}}
    was_training = module.training
    module.eval()
    try:
        ctx_merged_t, w_t = module.self(tx, attention_mask=extended)  # (B, L, E), (B, H, L, L) or None
        out_t = module.output.dense(ctx_merged_t)  # (B, L, E): the MHA output, before residual + LayerNorm
        g = torch.autograd.grad(out_t, [tx, *named.values()], torch.from_numpy(d_output))
        with torch.no_grad():
            Q_t, K_t, V_t = (_heads(lin(tx), H) for lin in (module.self.query, module.self.key, module.self.value))
            scores_t = (Q_t @ K_t.transpose(-2, -1)) * scaling  # HF's order: matmul, then scale
            full_t = module(tx, attention_mask=extended)[0]  # LayerNorm(dense(context) + x)
    finally:
        module.train(was_training)

    report = CrosscheckReport(
        f"transformers BertAttention ({module.self.config._attn_implementation})",
        dtype,
        rtol,
    )
    report.compare("output", "output.dense(self(x)[0])", out, out_t.detach().numpy())
    if w_t is not None:
        report.compare("attn_weights per head", "self(x)[1] (eager)", cache.attn_weights, w_t.detach().numpy())
    else:
        report.notes.append("attn_weights: not returned by this attn_implementation; use 'eager'")
    report.compare("Q", "self.query(x) → heads", cache.Q, Q_t.numpy())
    report.compare("K", "self.key(x) → heads", cache.K, K_t.numpy())
    report.compare("V", "self.value(x) → heads", cache.V, V_t.numpy())
    report.compare("scores", "(Q Kᵀ)·scaling (torch ops)", cache.scores, scores_t.numpy())
    report.compare("context", "self(x)[0] → heads", cache.context, _heads(ctx_merged_t.detach(), H).numpy())
    report.compare(
        "dL/dx (q+k+v paths)", "hidden_states.grad", grads["query"] + grads["key"] + grads["value"], g[0].numpy()
    )
    grads_theirs = params_from_state(dict(zip(named, (t.numpy() for t in g[1:]))), HF_BERT_NAME_MAP)
    _add_grad_rows(report, grads, grads_theirs, HF_BERT_NAME_MAP)
    ln = module.output.LayerNorm
    full = _layer_norm(out + x, _to_numpy(ln.weight), _to_numpy(ln.bias), ln.eps)
    report.compare(
        "BertAttention(x)",
        "LayerNorm(MHA(x)+x), fwd only",
        full,
        full_t.numpy(),
        note="residual + LayerNorm are not MHA",
    )
    return report
