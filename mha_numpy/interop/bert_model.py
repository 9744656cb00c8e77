"""The whole NumPy BERT against ``transformers.BertModel`` and torch autograd: every parameter gradient.

    from mha_numpy.bert import BertModel
    from mha_numpy.interop.bert_model import crosscheck_bert_model
    model = BertModel.from_pretrained(dtype=np.float64)                 # all-MiniLM-L6-v2
    print(crosscheck_bert_model(model, model.tokenize(["A sentence.", "And a longer second one."])))

Both sides get the same padded batch and the same random upstream gradient of ``last_hidden_state``; torch
differentiates ``transformers.BertModel`` (eager attention, eval mode, loaded by transformers itself from the
model's directory, or built from ``model.params`` for a model without one). The report has one row per
parameter (``model.params`` names = transformers' names), plus the forward output and the gradient of the
embeddings' output (``hidden_states[0]``), sorted worst first. torch and transformers are imported lazily.
"""

from __future__ import annotations

from dataclasses import fields

import numpy as np

from ._lazy import require
from .harness import Row, compare, named_grad_rows, our_grads, upstream
from .report import CrosscheckReport

DEFAULT_BERT_RTOL = {np.dtype(np.float64): 1e-9, np.dtype(np.float32): 1e-4}


def reference_bert(model):
    """A ``transformers.BertModel`` with the same weights as ``model`` (a mha_numpy BertModel), eager, eval mode,
    in the model's dtype: from the model's directory when it has one, else built from ``model.params``."""
    torch, transformers = require("torch"), require("transformers")
    tdtype = getattr(torch, model.dtype.name)
    if model.path is not None:
        ref = transformers.BertModel.from_pretrained(str(model.path), attn_implementation="eager", dtype=tdtype)
    else:
        cfg = {f.name: getattr(model.config, f.name) for f in fields(model.config)}
        config = transformers.BertConfig(**cfg, attn_implementation="eager")
        ref = transformers.BertModel(config, add_pooling_layer=False).to(tdtype)
        state = {name: torch.from_numpy(np.ascontiguousarray(p)) for name, p in model.params.items()}
        missing, unexpected = ref.load_state_dict(state, strict=False)
        if unexpected or any(not n.startswith("pooler.") for n in missing):
            raise ValueError(f"transformers' BertModel does not take these weights: {missing=} {unexpected=}")
    return ref.eval()


def crosscheck_bert_model(
    model,
    inputs,
    d_last_hidden_state: np.ndarray | None = None,
    rng: int | np.random.Generator | None = 0,
    rtol: float | None = None,
    reference=None,
) -> CrosscheckReport:
    """Forward, backward and every parameter gradient of ``model`` against torch autograd on transformers.

    inputs: a ``BertInputs`` (``model.tokenize(...)``) or a dict with input_ids, attention_mask, token_type_ids
    (B, L) ints. d_last_hidden_state: the upstream gradient (default: standard normal from ``rng``).
    rtol: pass threshold per tensor (default 1e-9 in float64, 1e-4 in float32). reference: a transformers
    BertModel to compare with (default ``reference_bert(model)``).
    """
    torch = require("torch")
    dtype = model.dtype
    rtol = DEFAULT_BERT_RTOL[dtype] if rtol is None else float(rtol)
    arrays = inputs.as_dict() if hasattr(inputs, "as_dict") else dict(inputs)
    ids, mask, types = (np.asarray(arrays[k]) for k in ("input_ids", "attention_mask", "token_type_ids"))
    ref = reference_bert(model) if reference is None else reference.eval()
    out, cache = model.forward(ids, mask, types)
    d = upstream(d_last_hidden_state, out.last_hidden_state.shape, dtype, rng)
    grads = model.backward(d, cache, return_hidden_grads=True)
    ours = {"last": out.last_hidden_state, "d embeddings": grads["hidden_states.0"], **our_grads(grads)}
    theirs = _run_reference(torch, ref, (ids, mask, types), d, model.params)
    rows = (
        Row("last_hidden_state", "BertModel(...).last_hidden_state", "last"),
        Row("d embeddings output", "hidden_states[0].grad", "d embeddings"),
        *named_grad_rows(model.params),
    )
    title = f"BertModel ({model.config.num_hidden_layers} layers) vs transformers + autograd"
    B, L = ids.shape
    note = (f"batch {B} x {L} tokens ({int(mask.sum())} real), random upstream gradient; {len(model.params)} parameter "
            "tensors; worst first. Names: transformers' (no 'bert.' prefix).")  # fmt: skip
    report = compare(title, dtype, rtol, rows, ours, theirs, [note])
    report.rows.sort(key=lambda row: (row.passed, -row.max_rel_err if not row.zero else 1.0))
    return report


def _run_reference(torch, ref, inputs, d, names) -> dict:
    """transformers' BertModel on ``inputs`` and autograd of <d, last_hidden_state> -> last_hidden_state, the
    gradient of the embeddings' output and of the parameters ``names``."""
    ref.zero_grad(set_to_none=True)
    r = ref(*(torch.from_numpy(a) for a in inputs), output_hidden_states=True)
    r.hidden_states[0].retain_grad()
    r.last_hidden_state.backward(torch.from_numpy(d))
    grads = {name: p.grad.numpy() for name, p in ref.named_parameters() if name in names}
    theirs = {"last": r.last_hidden_state.detach().numpy(), "d embeddings": r.hidden_states[0].grad.numpy()}
    return {**theirs, **our_grads(grads)}
