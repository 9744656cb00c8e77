"""JAX implementations under test: a function of JAX arrays, the backward by ``jax.vjp``.

``from_jax(fn)`` takes the calling convention (``adapters``) with JAX arrays; keywords are found by name as for
torch (``mask``, ``scale``, ``is_causal``, ``dropout_p`` with ``dropout_mask``), and a float mask goes to ``bias``
when the function has one and a bool mask to ``mask`` (``jax.nn.dot_product_attention``'s split). For
``jax.nn.dot_product_attention`` itself the layout is its own, (B, L, heads, d). Making the adapter turns on
``jax_enable_x64`` (JAX's float64, off by default, is a global setting): float64 cases need it.
"""

from __future__ import annotations

import numpy as np

from .._optional import require
from .adapters import (
    MASK_CONVENTIONS,
    Call,
    Implementation,
    Outcome,
    check_choice,
    convert_mask,
    features_of,
    from_layout,
    keywords,
    parameters,
    split_output,
    to_layout,
)
from .dtypes import DTYPES

JAX_NAMES = {"mask": ("mask", "bias", "attn_mask"), "scale": ("scale",), "is_causal": ("is_causal",),
             "dropout": ("dropout_mask",)}  # fmt: skip
ARGUMENT_NAMES = {"mask": ("mask", "attn_mask", "bias"), "scale": ("scale",), "is_causal": ("is_causal",),
                  "dropout_p": ("dropout_p",), "dropout_mask": ("dropout_mask",)}  # fmt: skip


def from_jax(fn, *, layout=None, mask_convention="attend", dtypes=DTYPES, without=(), jit=True,
             name=None) -> Implementation:  # fmt: skip
    """A JAX function of the calling convention; layout default "bhld", "blhd" for jax.nn.dot_product_attention.
    jit: run the forward and its VJP as one ``jax.jit`` program per case (one compilation instead of one per
    operation: about twice as fast; when the jitted program raises, the case is run eagerly: a function that cannot
    be traced, and float16, which XLA's CPU jit refuses in a dot with float32 accumulation)."""
    jax = require("jax", "mha_numpy.testing.from_jax")
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp

    if layout is None:
        layout = "blhd" if fn is jax.nn.dot_product_attention else "bhld"
    layout = check_choice(layout, "layout", ("bhld", "blhd"))
    mask_convention = check_choice(mask_convention, "mask_convention", MASK_CONVENTIONS)
    params = parameters(fn)
    names = {a: next((n for n in opts if params is None or n in params), None) for a, opts in ARGUMENT_NAMES.items()}
    names = {a: n for a, n in names.items() if n is not None}
    bias = params is not None and "bias" in params
    features = features_of(params, JAX_NAMES, without)
    jdtype = {"float64": jnp.float64, "float32": jnp.float32, "float16": jnp.float16, "bfloat16": jnp.bfloat16}

    def array(a, dtype):
        return jnp.asarray(a, dtype=jdtype[dtype] if np.issubdtype(np.asarray(a).dtype, np.floating) else None)

    def run(call: Call) -> Outcome:
        q, k, v = (array(to_layout(a, layout), call.dtype) for a in (call.q, call.k, call.v))
        mask = convert_mask(call.mask, mask_convention, call.dtype)
        kw = keywords(call, names, None if mask is None else array(mask, call.dtype))
        if mask is not None and bias and mask.dtype != np.bool_:
            kw["bias"] = kw.pop(names["mask"])  # an additive mask is jax's bias
        if "dropout_mask" in names and call.dropout_mask is not None:
            kw[names["dropout_mask"]] = jnp.asarray(call.dropout_mask)

        def forward(q_, k_, v_):
            out, weights = split_output(fn(q_, k_, v_, **kw))
            return out, weights

        def both(q_, k_, v_, d_out_):  # the forward and, given d_out, the VJP: one program
            if d_out_ is None:
                return (*forward(q_, k_, v_), None)
            out, vjp, weights = jax.vjp(forward, q_, k_, v_, has_aux=True)
            return out, weights, vjp(d_out_)

        d_out = None if call.d_out is None else array(to_layout(call.d_out, layout), call.dtype)
        if jit:
            try:
                out, weights, grads = jax.jit(both)(q, k, v, d_out)
            except Exception:  # noqa: BLE001 - not traceable (control flow on values), or what XLA's CPU jit
                out, weights, grads = both(q, k, v, d_out)  # lacks (float16 dots): eagerly, where it may raise
        else:
            out, weights, grads = both(q, k, v, d_out)
        grads = None if grads is None else tuple(from_layout(_numpy(g), layout) for g in grads)
        return Outcome(from_layout(_numpy(out), layout), _numpy(weights), grads)

    label = name or f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', repr(fn))}".lstrip(".")
    return Implementation(label, run, features, tuple(check_choice(t, "dtypes", DTYPES) for t in dtypes),
                          mask_convention)  # fmt: skip


def _numpy(x):
    """A JAX array -> NumPy (bfloat16 held as float32), or None."""
    if x is None:
        return None
    a = np.asarray(x)
    return a.astype(np.float32) if a.dtype.name == "bfloat16" else a
