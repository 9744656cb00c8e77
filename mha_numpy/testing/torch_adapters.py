"""torch implementations under test: a function of torch tensors (autograd for the backward), the module
``torch.nn.MultiheadAttention`` (identity projections: its attention alone), and Hugging Face's attention functions
(``transformers``' ``ALL_ATTENTION_FUNCTIONS["sdpa"]``, a model's ``eager_attention_forward``).

``from_torch(obj)`` picks the adapter: the MultiheadAttention class (or an instance of it), a function whose first
parameter is ``module`` (Hugging Face's attention interface), or any other function of the calling convention
(``adapters``), whose keywords are found by name: ``attn_mask`` / ``mask`` / ``attention_mask``, ``scale`` /
``scaling`` / ``softmax_scale``, ``is_causal`` / ``causal``, ``dropout_p`` with ``dropout_mask``, and
``enable_gqa=True`` passed on GQA cases when the function has it (as SDPA does). torch is imported when an
adapter is made, never by ``import mha_numpy.testing``.
"""

from __future__ import annotations

import contextlib
import inspect

import numpy as np

from .._optional import require
from ..interop import mask_to_torch_mha
from .adapters import (
    MASK_CONVENTIONS,
    Call,
    Implementation,
    NotSupported,
    Outcome,
    check_choice,
    convert_mask,
    features_of,
    from_layout,
    keywords,
    parameters,
    split_output,
    to_layout,
    written,
)
from .cases import FEATURES
from .dtypes import DTYPES

TORCH_NAMES = {"mask": ("attn_mask", "mask", "attention_mask"),
               "scale": ("scale", "scaling", "softmax_scale", "sm_scale"),
               "is_causal": ("is_causal", "causal"), "dropout": ("dropout_mask",)}  # fmt: skip
ARGUMENT_NAMES = {"mask": TORCH_NAMES["mask"], "scale": TORCH_NAMES["scale"], "is_causal": TORCH_NAMES["is_causal"],
                  "dropout_p": ("dropout_p", "dropout"), "dropout_mask": ("dropout_mask",)}  # fmt: skip
SDPA_BACKENDS = ("math", "flash_attention", "efficient_attention", "cudnn_attention")


def _torch():
    return require("torch", "mha_numpy.testing's torch adapters")


def _dtype(torch, name: str):
    return {"float64": torch.float64, "float32": torch.float32, "float16": torch.float16,
            "bfloat16": torch.bfloat16}[name]  # fmt: skip


def _tensor(torch, a, dtype: str, device, grad: bool = False):
    """A NumPy array (held in ``dtype``; see ``dtypes``) -> a torch tensor of that dtype on ``device``."""
    t = torch.from_numpy(np.ascontiguousarray(a)).to(device)
    if t.is_floating_point():
        t = t.to(_dtype(torch, dtype))
    return t.requires_grad_(True) if grad else t


def _numpy(t):
    """A torch tensor -> NumPy (bfloat16 held as float32), or None."""
    if t is None:
        return None
    t = t.detach().cpu()
    return (t.float() if t.dtype == _torch().bfloat16 else t).numpy()


def _snapshot(tensors: dict) -> dict:
    """The tensors' values now, as NumPy copies (to see later whether the function wrote into them)."""
    return {n: None if t is None else _numpy(t).copy() for n, t in tensors.items()}


def _grads(torch, out, inputs, d_out):
    """Autograd of out against the upstream gradient: (dq, dk, dv); an input out does not reach gets zeros."""
    if not out.requires_grad:
        raise ValueError("the output does not require grad: the function is not differentiable by autograd "
                         "(without=('backward',) runs its forward only)")  # fmt: skip
    grads = torch.autograd.grad(out, inputs, d_out, allow_unused=True)
    return tuple(torch.zeros_like(x) if g is None else g for g, x in zip(grads, inputs))


def _first(params, choices, default):
    if params is None:
        return default
    return next((n for n in choices if n in params), None)


def torch_function(fn, *, layout="bhld", mask_convention="attend", dtypes=DTYPES, without=(), device="cpu",
                   sdpa_backend=None, name=None) -> Implementation:  # fmt: skip
    """A torch function of the calling convention (its own keyword names are found; module docstring)."""
    torch = _torch()
    layout = check_choice(layout, "layout", ("bhld", "blhd"))
    mask_convention = check_choice(mask_convention, "mask_convention", MASK_CONVENTIONS)
    params = parameters(fn)
    names = {a: n for a, options in ARGUMENT_NAMES.items() if (n := _first(params, options, options[0]))}
    features = features_of(params, TORCH_NAMES, without)
    if params is not None and "dropout" in features and "dropout_p" not in names:
        features -= {"dropout"}
    gqa_flag = params is not None and "enable_gqa" in params
    backend = contextlib.nullcontext
    if sdpa_backend is not None:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        kind = getattr(SDPBackend, check_choice(sdpa_backend, "sdpa_backend", SDPA_BACKENDS).upper())
        backend = lambda: sdpa_kernel([kind])  # noqa: E731

    def run(call: Call) -> Outcome:
        backward = call.d_out is not None
        q, k, v = (_tensor(torch, to_layout(a, layout), call.dtype, device, backward) for a in (call.q, call.k, call.v))
        mask = convert_mask(call.mask, mask_convention, call.dtype)
        kw = keywords(call, names, None if mask is None else _tensor(torch, mask, call.dtype, device))
        if "dropout_mask" in kw:
            kw[names["dropout_mask"]] = _tensor(torch, call.dropout_mask, call.dtype, device)
        if gqa_flag and call.k.shape[1] != call.q.shape[1]:
            kw["enable_gqa"] = True
        handed = {"q": q, "k": k, "v": v, **{a: kw[n] for a, n in names.items() if isinstance(kw.get(n), torch.Tensor)}}
        before = _snapshot(handed)  # by our names (mask, dropout_mask): a tensor may be a copy (bfloat16, a device)
        with backend():
            out, weights = split_output(fn(q, k, v, **kw))
            changed = written(_snapshot(handed), before)
            grads = None
            if backward:
                d_out = _tensor(torch, to_layout(call.d_out, layout), call.dtype, device)
                grads = tuple(from_layout(_numpy(g), layout) for g in _grads(torch, out, (q, k, v), d_out))
        return Outcome(from_layout(_numpy(out), layout), _numpy(weights), grads, changed)

    label = name or getattr(fn, "__qualname__", None) or repr(fn)
    if sdpa_backend:
        label += f" ({sdpa_backend} backend)"
    return Implementation(label, run, features, tuple(dtypes), mask_convention)


def torch_mha(need_weights: bool = True, *, dtypes=DTYPES, without=(), device="cpu") -> Implementation:
    """``torch.nn.MultiheadAttention(E = H·d, H, bias=False, batch_first=True)`` with identity projections, so that
    its output is the merged heads' context: (B, Lq, H·d) <-> (B, H, Lq, d). Masks through
    ``mha_numpy.interop.mask_to_torch_mha`` (key_padding_mask / attn_mask, True = ignore). It has no scale, no
    causal flag without a mask, no given dropout mask and no GQA: those cases are n/a."""
    torch = _torch()

    def run(call: Call) -> Outcome:
        B, H, Lq, d = call.q.shape
        Lk, E = call.k.shape[2], H * d
        if call.k.shape[1] != H:
            raise NotSupported("torch MHA has no GQA")
        dt = _dtype(torch, call.dtype)
        m = torch.nn.MultiheadAttention(E, H, bias=False, batch_first=True, device=device, dtype=dt).eval()
        with torch.no_grad():
            m.in_proj_weight.copy_(torch.eye(E).repeat(3, 1))  # W_q = W_k = W_v = I
            m.out_proj.weight.copy_(torch.eye(E))
        backward = call.d_out is not None
        merged = [a.transpose(0, 2, 1, 3).reshape(B, a.shape[2], E) for a in (call.q, call.k, call.v)]  # (B, L, E)
        query, key, value = (_tensor(torch, a, call.dtype, device, backward) for a in merged)
        kpm = attn = None
        if call.mask is not None:  # -> key_padding_mask (B, Lk) or attn_mask (Lq, Lk) / (B·H, Lq, Lk), True = ignore
            kpm, attn = mask_to_torch_mha(call.mask, B, H, Lq, Lk)
            kpm, attn = (
                None if t is None else t.to(device, dt if t.is_floating_point() else t.dtype) for t in (kpm, attn)
            )
        out, weights = m(query, key, value, key_padding_mask=kpm, attn_mask=attn, need_weights=need_weights,
                         average_attn_weights=False)  # fmt: skip
        grads = None
        if backward:
            d_out = _tensor(torch, call.d_out.transpose(0, 2, 1, 3).reshape(B, Lq, E), call.dtype, device)
            gs = _grads(torch, out, (query, key, value), d_out)
            grads = tuple(_numpy(g).reshape(B, -1, H, d).transpose(0, 2, 1, 3) for g in gs)  # (B, H, L, d)
        out = _numpy(out).reshape(B, Lq, H, d).transpose(0, 2, 1, 3)  # (B, H, Lq, d)
        return Outcome(out, _numpy(weights), grads)

    features = frozenset({"mask", "backward"}) - set(without)
    impl = Implementation(f"torch.nn.MultiheadAttention (need_weights={need_weights})", run, features, tuple(dtypes),
                          "ignore")  # fmt: skip
    impl.notes.append(
        "identity projections (E = H·d, bias=False): the module's attention alone; it takes no scale, no is_causal "
        "without a mask, no dropout keep-mask and no GQA, so those cases are n/a"
    )
    return impl


def hf_attention(fn="sdpa", *, mask_convention=None, dtypes=DTYPES, without=(), device="cpu", name=None):
    """A Hugging Face attention function ``fn(module, query, key, value, attention_mask, scaling=..., dropout=...,
    [is_causal=...])`` -> (out (B, Lq, H, d), weights or None), or its name: "sdpa" (``ALL_ATTENTION_FUNCTIONS``)
    or "eager" (Llama's ``eager_attention_forward``). The module it reads is made per case
    (``num_key_value_groups`` = H / Hkv, ``is_causal``, eval mode). mask_convention: default "finite-min" for an
    eager function (what ``transformers.masking_utils.eager_mask`` builds: 0 / finfo(dtype).min) and "attend" (a
    bool mask, True = attend, as ``sdpa_mask`` builds) otherwise. Its dropout is sampled: no dropout cases."""
    torch = _torch()
    if isinstance(fn, str):
        fn = _hf_function(fn)
    params = {n for n, p in inspect.signature(fn).parameters.items() if p.kind != p.VAR_KEYWORD}
    eager = "eager" in getattr(fn, "__name__", "")
    mask_convention = check_choice(
        mask_convention or ("finite-min" if eager else "attend"), "mask_convention", MASK_CONVENTIONS
    )
    features = {"mask", "scale", "gqa", "backward"} | ({"is_causal"} if "is_causal" in params else set())
    features = frozenset(features - set(without))

    def run(call: Call) -> Outcome:
        B, H, Lq, d = call.q.shape
        module = torch.nn.Module().eval()
        module.num_key_value_groups, module.is_causal = H // call.k.shape[1], call.is_causal
        backward = call.d_out is not None
        q, k, v = (_tensor(torch, a, call.dtype, device, backward) for a in (call.q, call.k, call.v))
        mask = convert_mask(call.mask, mask_convention, call.dtype)
        mask = None if mask is None else _tensor(torch, mask, call.dtype, device)
        kw = {"scaling": d**-0.5 if call.scale is None else call.scale, "dropout": 0.0}
        if "is_causal" in params:
            kw["is_causal"] = call.is_causal
        handed = {"q": q, "k": k, "v": v, "mask": mask}
        before = _snapshot(handed)  # a tensor may be a copy (bfloat16, a device)
        out, weights = fn(module, q, k, v, mask, **kw)
        changed = written(_snapshot(handed), before)
        grads = None
        if backward:
            d_out = _tensor(torch, call.d_out.transpose(0, 2, 1, 3), call.dtype, device)  # (B, Lq, H, d)
            grads = tuple(_numpy(g) for g in _grads(torch, out, (q, k, v), d_out))
        return Outcome(_numpy(out).transpose(0, 2, 1, 3), _numpy(weights), grads, changed)

    label = name or f"{fn.__module__}.{fn.__name__}"
    impl = Implementation(label, run, features, tuple(dtypes), mask_convention)
    impl.notes.append(f"masks in the {mask_convention} convention (what transformers builds for this function); "
                      "its dropout is sampled inside, so no dropout cases")  # fmt: skip
    return impl


def _hf_function(name: str):
    if name == "sdpa":
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        return ALL_ATTENTION_FUNCTIONS["sdpa"]
    if name == "eager":
        from transformers.models.llama.modeling_llama import eager_attention_forward

        return eager_attention_forward
    raise ValueError(f"fn must be a Hugging Face attention function, 'sdpa' or 'eager', got {name!r:.60}")


def from_torch(obj, **options) -> Implementation:
    """The adapter for ``obj``: ``torch.nn.MultiheadAttention`` (the class or an instance) -> ``torch_mha``; a
    function whose first parameter is ``module`` -> ``hf_attention``; any other function -> ``torch_function``."""
    torch = _torch()
    mha = torch.nn.MultiheadAttention
    try:
        first = next(iter(inspect.signature(obj).parameters), None)
    except (TypeError, ValueError):
        first = None
    if (isinstance(obj, type) and issubclass(obj, mha)) or isinstance(obj, mha):
        adapter, args = torch_mha, ()
    elif first == "module":
        adapter, args = hf_attention, (obj,)
    elif callable(obj):
        adapter, args = torch_function, (obj,)
    else:
        raise ValueError(f"expected a torch attention function or torch.nn.MultiheadAttention, got {obj!r:.60}")
    unknown = sorted(set(options) - set(inspect.signature(adapter).parameters))
    if unknown:
        raise ValueError(f"{', '.join(unknown)} do not apply to {adapter.__name__} (the adapter of {obj!r:.60})")
    return adapter(*args, **options)


__all__ = ["from_torch", "torch_function", "torch_mha", "hf_attention", "FEATURES"]
