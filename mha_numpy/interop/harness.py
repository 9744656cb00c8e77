"""The one cross-check harness: a model's check against torch or transformers is a declaration, the comparison is
one loop (``compare``).

A check of one model (``torch_mha``, ``sdpa``, ``gqa``, ``hf_bert``, ``llama``, ``gemma2``, ``qwen3``, ``gpt_oss``,
``diffllama``, ``deepseek_v3``, ``bert_model``, ``llama_model``, ``seq2seq``) declares

- the other framework's module, built from a tiny config by the model file's ``hf_*`` builder (nothing downloaded),
  and ours imported from it through a name map (``names``: which torch tensor holds which of our parameters);
- how each side is called: ours forward and backward (``run_ours``), theirs in eval mode under torch autograd
  (``autograd``, ``run_hf_attention``; decoding with a cache: ``decode``, ``hf_decode``);
- what is compared: a tuple of ``Row`` (the report's row name, where theirs comes from, the key of the value on both
  sides), the gradient rows made from the name map (``grad_rows``: one row a parameter).

Both sides' results are flat dicts keyed as the rows say (gradients under ``grad_key(name)``, ours by our name,
theirs read out of torch's by the name map: ``theirs_grads``), and ``compare`` turns them into a
``CrosscheckReport`` in the declared order. What a check adds beyond the rows are its notes (how far the module as
shipped, with its float32 steps, is from ours: ``shipped_gap``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import numpy as np

from .. import masks as M
from .._checks import as_generator
from .names import NameMap, describe, params_from_state
from .report import CrosscheckReport

# --------------------------------------------------------------------------- the declaration and the one loop


@dataclass(frozen=True)
class Row:
    """One row of a cross-check: ``name`` in the report, ``theirs`` where the other side's number comes from, ``key``
    of the value in both sides' dicts. ``missing``: when theirs has None there, this note instead of the row ("":
    no note; None: the row is required). ``reference``: ours[key] against ours[reference] (ours checked against
    itself, e.g. decoding with a cache against one forward) instead of theirs[key]."""

    name: str
    theirs: str
    key: str
    note: str = ""
    missing: str | None = None
    reference: str = ""


def grad_key(name: str) -> str:
    """The key of the gradient of parameter ``name`` in a side's dict."""
    return f"grad {name}"


def grad_rows(name_map: Mapping, name: str = "dL/d{}", label: Callable = describe) -> tuple[Row, ...]:
    """One row a parameter of ``name_map`` (ours -> its torch tensor), labelled ``label(entry)``."""
    return tuple(Row(name.format(ours), label(entry), grad_key(ours)) for ours, entry in name_map.items())


def named_grad_rows(names) -> tuple[Row, ...]:
    """One row "d NAME" a parameter of a whole model whose names are the other framework's (autograd's .grad)."""
    return grad_rows(dict.fromkeys(names), "d {}", lambda _: "autograd .grad")


def our_grads(grads: Mapping) -> dict:
    """Our backward's dict of gradients, keyed for the gradient rows."""
    return {grad_key(name): g for name, g in grads.items()}


def theirs_grads(by_torch_name: Mapping, name_map: NameMap) -> dict:
    """torch's gradients by its parameter names -> ours (``name_map``), keyed for the gradient rows."""
    return our_grads(params_from_state(by_torch_name, name_map))


def compare(title: str, dtype, rtol: float, rows, ours: Mapping, theirs: Mapping, notes=()) -> CrosscheckReport:
    """The comparison loop of every cross-check: one report row a declared ``Row``, in order, ours[row.key] against
    theirs[row.key]; then ``notes``."""
    report = CrosscheckReport(title, dtype, rtol)
    for row in rows:
        if row.missing is not None and theirs.get(row.key) is None:
            if row.missing:
                report.notes.append(row.missing)
            continue
        other = ours[row.reference] if row.reference else theirs[row.key]
        report.compare(row.name, row.theirs, ours[row.key], other, note=row.note)
    report.notes.extend(notes)
    return report


# --------------------------------------------------------------------------- calling each side


def random_like(shape, dtype, rng) -> np.ndarray:
    """A standard normal array of ``shape`` and ``dtype``: the random upstream gradient of a cross-check."""
    return as_generator(rng).standard_normal(shape).astype(dtype)


def upstream(d_output, shape, dtype, rng) -> np.ndarray:
    """The upstream gradient: ``d_output`` as ``dtype``, or (None) a random one of ``shape``."""
    return random_like(shape, dtype, rng) if d_output is None else np.asarray(d_output, dtype=dtype)


def positions_of(pos, B: int, L: int) -> np.ndarray:
    """None -> 0..L-1; (L,) or (B, L) -> (B, L) int64."""
    return np.broadcast_to(np.arange(L) if pos is None else np.asarray(pos), (B, L)).astype(np.int64)


def on_kernel(module, kernel=None, recompute: bool = False):
    """An imported module set to run on ``kernel`` (None: its default) and with ``recompute``, for a check's row."""
    if kernel is not None:
        module.kernel = kernel
    module.recompute = recompute
    return module


def run_ours(module, inputs: tuple, d_output, dx_from=("query", "key", "value"), **kwargs) -> tuple[dict, dict]:
    """Our module's forward on ``inputs`` (``kwargs`` passed on) and backward of ``d_output`` -> (values, grads).

    values: "output"; "Q", "K", "V", "scores", "context", "weights" from the cache (None where it has none), read
    before the backward; "dx": the sum of the gradients ``dx_from`` (self-attention: one input on every path; () for
    none); the gradients keyed for the gradient rows."""
    out, cache = module.forward(*inputs, **kwargs)
    values = {"output": out, "weights": getattr(cache, "attn_weights", None)}
    values.update({name: getattr(cache, name, None) for name in ("Q", "K", "V", "scores", "context")})
    grads = module.backward(d_output, cache)
    if dx_from:
        values["dx"] = sum(grads[name] for name in dx_from)
    return {**values, **our_grads(grads)}, grads


@contextmanager
def eval_mode(module):
    """The torch module in eval mode (no dropout) within the block; its mode restored afterwards."""
    was_training = module.training
    module.eval()
    try:
        yield module
    finally:
        module.train(was_training)


def tensor(torch, x, grad: bool = False):
    """An array -> a torch tensor sharing a contiguous copy's memory; ``grad``: a leaf that requires grad."""
    t = torch.from_numpy(np.ascontiguousarray(x))
    return t.requires_grad_() if grad else t


def autograd(torch, output, leaves, named: Mapping, d_output) -> tuple[list, dict]:
    """torch autograd of <d_output, output> -> ([the gradient of each leaf], {parameter name: gradient}), arrays."""
    g = [t.numpy() for t in torch.autograd.grad(output, [*leaves, *named.values()], tensor(torch, d_output))]
    return g[: len(leaves)], dict(zip(named, g[len(leaves) :]))


def run_hf_attention(torch, module, x, cos_sin, mask_t, d_output, name_map: NameMap) -> dict:
    """A Hugging Face decoder attention called as its model calls it, ``module(x, (cos, sin), mask)``, in eval mode,
    and torch autograd of ``d_output`` -> {"output", "weights" (None when it returns none), "dx", the parameters'
    gradients read as ours through ``name_map``}."""
    tx, named = tensor(torch, x, grad=True), dict(module.named_parameters())
    with eval_mode(module):
        out_t, w_t = module(tx, cos_sin, mask_t)
        (dx,), grads = autograd(torch, out_t, [tx], named, d_output)
    weights = None if w_t is None else w_t.detach().numpy()
    return {"output": out_t.detach().numpy(), "weights": weights, "dx": dx, **theirs_grads(grads, name_map)}


def relative(ours, theirs) -> float:
    """max |ours - theirs| relative to the largest entry of theirs (a CrosscheckReport row's measure)."""
    ours, theirs = np.asarray(ours), np.asarray(theirs)
    return float(np.abs(ours - theirs).max() / max(np.abs(theirs).max(), np.finfo(np.float64).tiny))


def shipped_gap(ours: Mapping, shipped: Mapping, output: str = "output", grads=None) -> tuple[float, float]:
    """How far the other side as shipped is from ours: (relative error of ``output``, worst relative error of the
    gradients ``grads``, default every gradient key of ``shipped``)."""
    keys = [k for k in shipped if k.startswith("grad ")] if grads is None else [grad_key(n) for n in grads]
    return relative(ours[output], shipped[output]), max(relative(ours[k], shipped[k]) for k in keys)


# --------------------------------------------------------------------------- decoding with a cache


def decode_calls(L: int, prefill: int, chunk: int = 1) -> list[tuple[int, int]]:
    """The decoding cross-checks' calls: positions [a, b) of each, a prefill of ``prefill`` tokens, then ``chunk``
    tokens a call up to L. ValueError naming prefill or chunk."""
    if not 1 <= prefill <= L:
        raise ValueError(f"prefill must lie in [1, L={L}], got {prefill}")
    if isinstance(chunk, bool) or not isinstance(chunk, (int, np.integer)) or chunk < 1:
        raise ValueError(f"chunk must be a positive int, got {chunk!r}")
    return [(0, prefill)] + [(t, min(t + chunk, L)) for t in range(prefill, L, chunk)]


def decode(calls, step: Callable) -> np.ndarray:
    """Each call's output ``step(a, b)`` (B, b - a, E), concatenated along the sequence: (B, L, E)."""
    return np.concatenate([step(a, b) for a, b in calls], axis=1)


def hf_decode(torch, module, x, calls, cos_sin, mask_of: Callable, context: Callable = nullcontext):
    """HF's decoding with a ``DynamicCache``: ``module(x[:, a:b], (cos, sin)[:, a:b], mask_of(a, b, cache),
    cache=cache)`` a call, in eval mode without gradients, within ``context()`` -> (the outputs (B, L, E), the
    cache's layer of the module)."""
    from transformers import DynamicCache

    hf_cache, tx, (cos, sin) = DynamicCache(config=module.config), tensor(torch, x), cos_sin

    def step(a, b):
        return module(tx[:, a:b], (cos[:, a:b], sin[:, a:b]), mask_of(a, b, hf_cache), cache=hf_cache)[0].numpy()

    with eval_mode(module), torch.no_grad(), context():
        outputs = decode(calls, step)
    return outputs, hf_cache.layers[module.layer_idx]


def decoding_rows(call: str, full=("cached ≡ full causal", "ours, one causal forward"),
                  keys=("cached keys (RoPE'd)", "DynamicCache keys"),
                  values=("cached values", "DynamicCache values")) -> tuple[Row, ...]:  # fmt: skip
    """The rows of a decoding check: every call's outputs against HF's (``call``), ours cached against ours in one
    forward, the cache's keys and values against HF's."""
    return (
        Row("outputs, every call", call, "outputs"),
        Row(*full, "outputs", note="ours vs ours", reference="full"),
        Row(*keys, "keys"),
        Row(*values, "values"),
    )


# --------------------------------------------------------------------------- torch ops for what modules hide


def heads(torch_x, num_heads: int):
    """torch (B, L, E) -> (B, H, L, d), the same split as ours (head h = features h*d ... (h+1)*d - 1)."""
    B, L, E = torch_x.shape
    return torch_x.reshape(B, L, num_heads, E // num_heads).transpose(1, 2)  # (B, H, L, d)


def torch_attention(torch, Q, K, V, scale: float, additive):
    """Torch ops: scores = (Q scale) Kᵀ, weights = softmax(scores + mask), context = weights V.

    Fully masked rows: torch's softmax gives NaN; set to 0 like SDPA and mha_numpy do.
    """
    scores = (Q * scale) @ K.transpose(-2, -1)  # (B, H, Lq, Lk), torch MHA's order: scale q first
    masked = scores if additive is None else scores + additive
    weights = torch.softmax(masked, dim=-1).nan_to_num(0.0)  # (B, H, Lq, Lk)
    return scores, weights, weights @ V  # context (B, H, Lq, d)


def additive_tensor(torch, mask, dtype):
    """Our mask (bool or float) -> the float tensor added to the scores (0 / -inf for bool); None stays None."""
    return None if mask is None else torch.from_numpy(np.ascontiguousarray(M.to_additive(mask, dtype)))
