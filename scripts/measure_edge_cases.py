"""Measure what PyTorch and Hugging Face do on the edge cases of docs/edge-cases.md and print the table.

    python scripts/measure_edge_cases.py                 # the table pasted into docs/edge-cases.md
    python scripts/measure_edge_cases.py --measure-ours  # one more column: mha_numpy as it behaves now

Columns (all float64 unless the case says otherwise, E = 4, H = 2, B = 2, Lq = 3, Lk = 4, seeded):
- mha_numpy, documented: the behaviour mha_numpy defines (the text of docs/edge-cases.md), not a measurement;
  ``--measure-ours`` adds what ``MultiHeadAttention`` / ``mha_numpy.functional`` actually do, to check it.
- torch MHA: ``torch.nn.MultiheadAttention(batch_first=True)`` with ``need_weights=True`` (per-head weights)
  and with ``need_weights=False`` (the path most models take).
- SDPA: ``torch.nn.functional.scaled_dot_product_attention`` on per-head (B, H, L, d) tensors.
- HF eager: ``transformers.models.bert.modeling_bert.eager_attention_forward`` (what BertSelfAttention runs
  with ``attn_implementation="eager"``) with the mask BertModel builds for it: additive, 0 = keep,
  ``finfo.min`` = blocked. (With the default "sdpa" implementation, BertModel passes a bool mask to SDPA: the
  SDPA column.)
Each cell describes the attention output (context) of the row concerned, the attention weights where the
framework returns them, and the gradient of the query where that is what the case is about. An exception is
shown as ``error: Type: message``. Needs torch and transformers (the dev install); nothing is downloaded.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

B, H, Lq, Lk, d = 2, 2, 3, 4, 2
E = H * d
FRAMEWORKS = ("torch MHA, need_weights=True", "torch MHA, need_weights=False", "SDPA", "HF eager")


# --------------------------------------------------------------------------- describing a result


def rows_state(x) -> str:
    """'finite' / 'NaN' / 'NaN in rows [...]' / 'zeros' for an array (..., L, n), judged per row (last axis)."""
    x = np.asarray(x)
    if x.size == 0:
        return f"empty {tuple(x.shape)}"
    bad = ~np.isfinite(x).all(axis=-1)  # (..., L)
    if bad.all():
        return "NaN" if np.isnan(x).all() else "non-finite"
    if bad.any():
        return f"NaN in {int(bad.sum())} of {bad.size} rows"
    return "zeros" if not x.any() else "finite"


def row_kind(w) -> str:
    """How one row of attention weights looks: zeros, uniform, NaN, or normal."""
    w = np.asarray(w)
    if np.isnan(w).any():
        return "NaN"
    if not w.any():
        return "zero"
    if np.allclose(w, 1.0 / w.size, rtol=0, atol=1e-12):
        return "uniform 1/Lk"
    return "softmax of the scores (not uniform)"


def _err(diff) -> str:
    """A max |error| as a class that does not depend on the CPU (AVX2 and AVX-512 round differently)."""
    e = float(np.abs(diff).max())
    return "< 1e-6" if e < 1e-6 else f"{e:.0e}"


def attempt(fn) -> str:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return fn()
    except Exception as e:  # what the framework raises is the measurement
        msg = " ".join(str(e).split())
        return f"error: {type(e).__name__}: {msg[:70]}{'…' if len(msg) > 70 else ''}"


# --------------------------------------------------------------------------- the frameworks, one call each


def _t(x, grad=False):
    import torch

    t = torch.tensor(np.asarray(x))
    return t.requires_grad_(True) if grad else t


def torch_mha(q, k, v, need_weights, kpm=None, attn_mask=None, E_=E, H_=H, dropout=0.0, is_causal=False):
    """-> (output, weights or None, query gradient of sum(output), module): numpy arrays."""
    import torch

    torch.manual_seed(0)
    m = torch.nn.MultiheadAttention(E_, H_, batch_first=True, dtype=torch.float64, dropout=dropout)
    qt = _t(q, grad=True)
    out, w = m(qt, _t(k), _t(v), key_padding_mask=None if kpm is None else _t(kpm),
               attn_mask=None if attn_mask is None else _t(attn_mask), need_weights=need_weights,
               average_attn_weights=False, is_causal=is_causal)  # fmt: skip
    out.sum().backward()
    grad = qt.grad.numpy() if qt.grad is not None else np.zeros(q.shape)
    return out.detach().numpy(), None if w is None else w.detach().numpy(), grad, m


def sdpa(q, k, v, mask=None, **kw):
    """-> (context, query gradient of sum(context)); per-head tensors (B, H, L, d)."""
    import torch.nn.functional as F

    qt = _t(q, grad=True)
    mask = _t(mask) if isinstance(mask, np.ndarray) else mask  # a torch CausalBias passes as it is
    out = F.scaled_dot_product_attention(qt, _t(k), _t(v), attn_mask=mask, **kw)
    out.sum().backward()
    return out.detach().numpy(), qt.grad.numpy()


def hf_eager(q, k, v, mask=None):
    """-> (context (B, Lq, H, d), weights (B, H, Lq, Lk), query gradient); HF's eager attention function."""
    import torch
    from transformers.models.bert.modeling_bert import eager_attention_forward

    qt = _t(q, grad=True)
    out, w = eager_attention_forward(torch.nn.Module().eval(), qt, _t(k), _t(v), None if mask is None else _t(mask),
                                     scaling=q.shape[-1] ** -0.5)  # fmt: skip
    out.sum().backward()
    return out.detach().numpy(), w.detach().numpy(), qt.grad.numpy()


# --------------------------------------------------------------------------- the cases

RNG = np.random.default_rng(0)
X = RNG.standard_normal((B, Lq, E))  # (B, Lq, E) for MHA
KV = RNG.standard_normal((B, Lk, E))  # (B, Lk, E)
Q4, K4, V4 = (RNG.standard_normal((B, H, n, d)) for n in (Lq, Lk, Lk))  # per head, for SDPA and HF


def mask_cases(blocked_value):
    """A float mask (Lq, Lk) whose row 0 is all ``blocked_value`` (other rows 0): row 0 is fully masked."""
    m = np.zeros((Lq, Lk))
    m[0] = blocked_value
    return m


def masked_row(kind: str) -> dict:
    """Row 0 of every (batch, head) fully blocked, by a bool mask or by the float value ``kind`` names."""
    value = {"-inf": -np.inf, "finfo.min": np.finfo(np.float64).min, "-1e9": -1e9}.get(kind)
    keep = np.ones((Lq, Lk), bool)
    keep[0] = False
    add = None if value is None else mask_cases(value)
    mha_mask = ~keep if value is None else add  # torch MHA: bool True = ignore
    sdpa_mask = keep if value is None else add  # SDPA: bool True = attend
    hf_mask = np.where(keep, 0.0, np.finfo(np.float64).min) if value is None else add  # HF builds finfo.min

    def mha(nw):
        out, w, g, _ = torch_mha(X, KV, KV, nw, attn_mask=mha_mask)
        wt = "" if w is None else f"weights {row_kind(w[0, 0, 0])}, "
        return f"{wt}context row {rows_state(out[:, :1])}, d query {rows_state(g[:, :1])}"

    def sd():
        out, g = sdpa(Q4, K4, V4, sdpa_mask)
        return f"context row {rows_state(out[:, :, :1])}, d query {rows_state(g[:, :, :1])}"

    def hf():
        out, w, g = hf_eager(Q4, K4, V4, hf_mask)
        return (
            f"weights {row_kind(w[0, 0, 0])}, context row {rows_state(out[:, :1])}, d query {rows_state(g[:, :, :1])}"
        )

    return {FRAMEWORKS[0]: lambda: mha(True), FRAMEWORKS[1]: lambda: mha(False), FRAMEWORKS[2]: sd, FRAMEWORKS[3]: hf}


def empty(axis: str) -> dict:
    """A zero-size batch, query length or key length."""
    Bn, Lqn, Lkn = {"B": (0, Lq, Lk), "Lq": (B, 0, Lk), "Lk": (B, Lq, 0)}[axis]
    x, kv = RNG.standard_normal((Bn, Lqn, E)), RNG.standard_normal((Bn, Lkn, E))
    q4, k4 = RNG.standard_normal((Bn, H, Lqn, d)), RNG.standard_normal((Bn, H, Lkn, d))

    def mha(nw):
        out, w, g, m = torch_mha(x, kv, kv, nw)
        is_bias = out.size and np.allclose(out, m.out_proj.bias.detach().numpy())
        return f"output {'= b_o ' + str(out.shape) if is_bias else rows_state(out)}, d query {rows_state(g)}"

    def sd():
        out, g = sdpa(q4, k4, k4)
        return f"context {rows_state(out)}, d query {rows_state(g)}"

    def hf():
        out, w, g = hf_eager(q4, k4, k4)
        return f"context {rows_state(out)}, weights {tuple(w.shape)}, d query {rows_state(g)}"

    return {FRAMEWORKS[0]: lambda: mha(True), FRAMEWORKS[1]: lambda: mha(False), FRAMEWORKS[2]: sd, FRAMEWORKS[3]: hf}


def nan_or_inf(where: str) -> dict:
    """A NaN in query 0, a NaN in key 0, or a +inf in a float mask at (query 0, key 0)."""
    x, kv, q4, k4 = X.copy(), KV.copy(), Q4.copy(), K4.copy()
    add = np.zeros((Lq, Lk))
    if where == "nan query":
        x[:, 0, 0] = q4[:, :, 0, 0] = np.nan
    elif where == "nan key":
        kv[:, 0, 0] = k4[:, :, 0, 0] = np.nan
    else:
        add[0, 0] = np.inf

    def mha(nw):
        out, w, _, _ = torch_mha(x, kv, kv, nw, attn_mask=add)
        wt = "" if w is None else f"weights row 0 {row_kind(w[0, 0, 0])}, "
        return f"{wt}output {rows_state(out)}"

    def sd():
        return f"context {rows_state(sdpa(q4, k4, k4, add)[0])}"

    def hf():
        out, w, _ = hf_eager(q4, k4, k4, add)
        return f"weights row 0 {row_kind(w[0, 0, 0])}, context {rows_state(out.transpose(0, 2, 1, 3))}"

    return {FRAMEWORKS[0]: lambda: mha(True), FRAMEWORKS[1]: lambda: mha(False), FRAMEWORKS[2]: sd, FRAMEWORKS[3]: hf}


def large_logits(scale: float) -> dict:
    """float32 scores scale, scale - 1, scale - 3, exactly representable (head dim 1, so the 1/sqrt(d) scaling is
    1): the max |error| of the weights (or, where no weights are returned, of the context) against float64."""
    q = np.ones((1, 1, 1, 1), np.float32)  # (B, H, Lq, d) = (1, 1, 1, 1)
    k = np.array([scale, scale - 1, scale - 3], np.float32).reshape(1, 1, 3, 1)  # the scores, exactly
    v = RNG.standard_normal((1, 1, 3, 1)).astype(np.float32)
    ref_w = np.exp(-np.array([0.0, 1.0, 3.0])) / np.exp(-np.array([0.0, 1.0, 3.0])).sum()  # (3,), float64
    ref_ctx = ref_w @ v[0, 0].astype(np.float64)  # (1,)

    def sd():
        return f"context error {_err(sdpa(q, k, v)[0][0, 0, 0] - ref_ctx)}"

    def hf():
        return f"weights error {_err(hf_eager(q, k, v)[1][0, 0, 0] - ref_w)}"

    def mha(nw):
        import torch

        m = torch.nn.MultiheadAttention(1, 1, batch_first=True, bias=False, dtype=torch.float32)
        with torch.no_grad():  # identity projections: the scores are q·k exactly
            m.in_proj_weight.fill_(1.0)
            m.out_proj.weight.fill_(1.0)
        out, w = m(_t(q[0]), _t(k[0]), _t(v[0]), need_weights=nw)
        if nw:
            return f"weights error {_err(w.detach().numpy()[0, 0] - ref_w)}"
        return f"context error {_err(out.detach().numpy()[0, 0] - ref_ctx)}"

    return {FRAMEWORKS[0]: lambda: mha(True), FRAMEWORKS[1]: lambda: mha(False), FRAMEWORKS[2]: sd, FRAMEWORKS[3]: hf}


def bad_arguments(what: str) -> dict:
    """Arguments a caller gets wrong: an int 0/1 mask, a mask of the wrong shape, dropout 1.5, head dim 0."""

    def mha(nw):
        if what == "int mask":
            return "accepted" if torch_mha(X, KV, KV, nw, attn_mask=np.zeros((Lq, Lk), np.int64)) else ""
        if what == "mask shape":
            return "accepted" if torch_mha(X, KV, KV, nw, attn_mask=np.zeros((Lq, Lk + 1), bool)) else ""
        if what == "dropout":
            return "accepted at construction; " + attempt(lambda: torch_mha(X, KV, KV, nw, dropout=1.5) and "runs")
        return "accepted" if torch_mha(X[..., :2], KV[..., :2], KV[..., :2], nw, E_=2, H_=4) else ""

    def sd():
        kw = {
            "int mask": dict(mask=np.zeros((Lq, Lk), np.int64)),
            "mask shape": dict(mask=np.zeros((Lq, Lk + 1), bool)),
            "dropout": dict(dropout_p=1.5),
        }.get(what)
        if kw is None:  # head dim 0
            out, _ = sdpa(Q4[..., :0], K4[..., :0], V4[..., :0])
            return f"accepted: context {rows_state(out)}"
        return "accepted: " + rows_state(sdpa(Q4, K4, V4, **kw)[0])

    def hf():
        from transformers import BertConfig
        from transformers.models.bert.modeling_bert import BertSelfAttention

        if what == "int mask":
            return "its convention: attention_mask (B, L) 1 = keep, 0 = padding"
        if what == "mask shape":
            return "accepted: " + rows_state(hf_eager(Q4, K4, V4, np.zeros((Lq, Lk + 1)))[0])
        if what == "dropout":
            config = BertConfig(hidden_size=E, num_attention_heads=H, attention_probs_dropout_prob=1.5)
        else:  # head dim 0: hidden size 2 over 4 heads
            config = BertConfig(hidden_size=2, num_attention_heads=4)
        return attempt(lambda: BertSelfAttention(config) and "accepted at construction")

    return {FRAMEWORKS[0]: lambda: mha(True), FRAMEWORKS[1]: lambda: mha(False), FRAMEWORKS[2]: sd, FRAMEWORKS[3]: hf}


def causal_alignment(Lq_: int, Lk_: int) -> dict:
    """Each framework's own causal option on Lq_ queries and Lk_ keys: which alignment it is (its output against
    mha_numpy's attention with ``causal_mask(Lq, Lk, align=...)`` on the rows that have a key, to 1e-10), and what
    its fully masked rows give."""
    from mha_numpy import functional as ours
    from mha_numpy import masks

    q4, k4, v4 = (RNG.standard_normal((B, H, n, d)) for n in (Lq_, Lk_, Lk_))
    x, kv = RNG.standard_normal((B, Lq_, E)), RNG.standard_normal((B, Lk_, E))

    def alignment(out) -> str:
        for align in ("top-left", "bottom-right"):
            keep = masks.causal_mask(Lq_, Lk_, align=align)
            live = keep.any(-1)  # (Lq,) rows with a key
            ref = ours.scaled_dot_product_attention(q4, k4, v4, keep)[0]
            if np.allclose(out[:, :, live], ref[:, :, live], rtol=0, atol=1e-10):
                dead = f"; its rows without a key: {rows_state(out[:, :, ~live])}" if (~live).any() else ""
                return align + dead
        return "neither alignment"

    def sd():
        from torch.nn.attention.bias import causal_lower_right

        lower_right = sdpa(q4, k4, v4, causal_lower_right(Lq_, Lk_))[0]
        return (
            f"is_causal: {alignment(sdpa(q4, k4, v4, is_causal=True)[0])}; causal_lower_right: {alignment(lower_right)}"
        )

    def hf():
        import torch
        from transformers.masking_utils import eager_mask

        mask = eager_mask(B, Lq_, Lk_, q_offset=Lk_ - Lq_, dtype=torch.float64).numpy()  # a cache of Lk - Lq tokens
        out = hf_eager(q4, k4, v4, mask)[0].transpose(0, 2, 1, 3)  # (B, H, Lq, d)
        return f"its mask with q_offset = Lk - Lq (a cache): {alignment(out)}"

    def mha(nw):
        return attempt(lambda: torch_mha(x, kv, kv, nw, is_causal=True) and "runs")

    return {FRAMEWORKS[0]: lambda: mha(True), FRAMEWORKS[1]: lambda: mha(False), FRAMEWORKS[2]: sd, FRAMEWORKS[3]: hf}


def document_row() -> dict:
    """Two packed documents (2 and 1 tokens) and one padding token, causal: position ids 0 1 0 0, attention_mask
    1 1 1 0. The padding token's row (row 3) attends to nothing. Each framework gets the mask it would use:
    transformers' (packed sequences found from the position ids, and the padding), ours converted for torch MHA."""
    import torch
    import transformers.masking_utils as mu

    from mha_numpy import masks

    L = 4
    x, q4, k4, v4 = RNG.standard_normal((B, L, E)), *(RNG.standard_normal((B, H, L, d)) for _ in range(3))
    keep = masks.document_mask([2, 1], causal=True, L=L)  # (L, L), ours
    ids, am = torch.tensor([[0, 1, 0, 0]] * B), torch.tensor([[1, 1, 1, 0]] * B).bool()
    fn = mu.and_masks(mu.causal_mask_function, mu.packed_sequence_mask_function(mu.find_packed_sequence_indices(ids)))
    hf_bool = mu.sdpa_mask(B, L, L, mask_function=fn, attention_mask=am, allow_is_causal_skip=False).numpy()
    hf_add = mu.eager_mask(B, L, L, mask_function=fn, attention_mask=am, dtype=torch.float64).numpy()
    same = "= ours" if np.array_equal(hf_bool, np.broadcast_to(keep, hf_bool.shape)) else "≠ ours"

    def mha(nw):
        out, w, g, _ = torch_mha(x, x, x, nw, attn_mask=~keep)
        wt = "" if w is None else f"weights {row_kind(w[0, 0, 3])}, "
        return f"{wt}context row {rows_state(out[:, 3:])}, d query {rows_state(g[:, 3:])}"

    def sd():
        out, g = sdpa(q4, k4, v4, hf_bool)
        return (
            f"transformers' mask ({same}): context row {rows_state(out[:, :, 3:])}, d query {rows_state(g[:, :, 3:])}"
        )

    def hf():
        out, w, g = hf_eager(q4, k4, v4, hf_add)
        return (
            f"weights {row_kind(w[0, 0, 3])}, context row {rows_state(out[:, 3:])}, d query {rows_state(g[:, :, 3:])}"
        )

    return {FRAMEWORKS[0]: lambda: mha(True), FRAMEWORKS[1]: lambda: mha(False), FRAMEWORKS[2]: sd, FRAMEWORKS[3]: hf}


# (case, what mha_numpy does (docs/edge-cases.md), the measurements)
CASES = [
    (
        "Lk = 0 (empty key/value memory)",
        "output = b_o, weights (B, H, Lq, 0), zero gradients for query, key, value and W_q..W_v",
        empty("Lk"),
    ),  # fmt: skip
    ("Lq = 0", "empty output (B, 0, E), zero gradients", empty("Lq")),
    ("B = 0", "empty output (0, Lq, E), zero gradients", empty("B")),
    ("head dim 0 (E = 2, H = 4)", "ValueError naming embed_dim and num_heads", bad_arguments("head dim")),
    ("NaN in one query", "NaN in that query's row only", nan_or_inf("nan query")),
    ("NaN in one key", "NaN in every row that sees that key", nan_or_inf("nan key")),
    ("+inf score (float mask +inf at one entry)", "NaN in that row (softmax of inf - inf)", nan_or_inf("+inf")),
    ("row fully masked by a bool mask", "zero weights, zero context, zero gradients", masked_row("bool")),
    ("row fully masked by -inf", "zero weights, zero context, zero gradients", masked_row("-inf")),
    (
        "row fully masked by finfo.min (HF's value)",
        "uniform weights 1/Lk (the plain softmax: finfo.min swallows the scores)",
        masked_row("finfo.min"),
    ),  # fmt: skip
    (
        "row fully masked by -1e9",
        "the plain softmax of scores - 1e9: float64 keeps the scores (softmax of the "
        "scores), float32 swallows them (uniform 1/Lk)",
        masked_row("-1e9"),
    ),  # fmt: skip
    (
        "causal with Lq = 3 < Lk = 4",
        "causal_mask(Lq, Lk, align=...): top-left by default (SDPA's is_causal), bottom-right for a cache "
        "(align='bottom-right': SDPA's causal_lower_right, FlashAttention, HF with a cache, our KVCache)",
        causal_alignment(3, 4),
    ),  # fmt: skip
    (
        "causal with Lq = 4 > Lk = 3",
        "top-left: every row has a key; bottom-right: row 0 has none: zero weights, zero context, zero gradients",
        causal_alignment(4, 3),
    ),  # fmt: skip
    (
        "fully masked document row (packed documents of 2 and 1 tokens, then a padding token)",
        "masks.document_mask([2, 1], causal=True, L=4) (or its StructuredMask): the padding row gets zero weights, "
        "zero context, zero gradients",
        document_row(),
    ),  # fmt: skip
    ("float32 scores around 1e3", "same as the plain softmax: error < 1e-6, every impl", large_logits(1e3)),
    ("float32 scores around 1e4", "same as the plain softmax: error < 1e-6, every impl", large_logits(1e4)),
    ("float32 scores around 1e6", "same as the plain softmax: error < 1e-6, every impl", large_logits(1e6)),
    (
        "integer 0/1 mask",
        "ValueError naming mask (convert with masks.padding_mask(attention_mask=...))",
        bad_arguments("int mask"),
    ),  # fmt: skip
    ("mask of the wrong shape (Lk + 1)", "ValueError naming mask and its shape", bad_arguments("mask shape")),
    ("dropout 1.5", "ValueError naming dropout", bad_arguments("dropout")),
]


# --------------------------------------------------------------------------- mha_numpy verify's conventions (issue 23)
# A block of its own: rows measured through mha_numpy.testing (the verify tool) on one small case each.


def _verify_adapters():
    """The four columns as mha_numpy.testing implementations."""
    import torch
    from transformers.models.bert.modeling_bert import eager_attention_forward

    from mha_numpy.testing import from_torch, hf_attention, torch_mha

    sdpa = from_torch(torch.nn.functional.scaled_dot_product_attention)
    return dict(zip(FRAMEWORKS, (torch_mha(True), torch_mha(False), sdpa, hf_attention(eager_attention_forward))))


def verified(case_kwargs: dict, describe=None) -> dict:
    """Run one mha_numpy.testing case (float64, B = 2, H = 2, d = 2 unless given) on each framework: PASS, or FAIL
    with the convention the tool detects, or n/a with why. ``describe(impl, result) -> str`` may say more."""
    from mha_numpy.testing import Case, run_case

    kw = {"group": "edge", "dtype": "float64", "B": B, "H": H, "Hkv": H, "Lq": Lq, "Lk": Lk, "d": d, **case_kwargs}
    case = Case(**kw)

    def one(name):
        def measure():
            impl = _verify_adapters()[name]
            r = run_case(impl, case)
            if r.status == "n/a":
                return f"n/a ({r.message})"
            if describe is not None:
                return describe(impl, r)
            return r.status if not r.failed else f"{r.status}: {r.detected or r.message}"

        return measure

    return {f: one(f) for f in FRAMEWORKS}


def finite_min_row_gradient(impl, result) -> str:
    """A row fully masked by finfo.min: the forward is the uniform softmax; is the query's gradient that of it?"""
    forward = "forward uniform (right)" if result.checks["out"].passed else "forward wrong"
    if result.status == "PASS":
        return f"{forward}, gradients right"
    from mha_numpy.testing import reference

    ref = reference(result.case.inputs(), result.case).values
    wrong = [n for n in ("dq", "dk", "dv") if not result.checks[n].passed]
    off = min(result.checks[n].error / np.abs(ref[n]).max() for n in wrong)
    size = "more than 1e-2" if off > 1e-2 else _err(off)
    return f"{forward}, {', '.join(wrong)} wrong (by {size} of their largest entry): no known convention"


def dropout_weights(p: float = 0.5) -> dict:
    """Are the returned attention weights those before dropout (ours) or after? Rows summing to 1 = before."""

    def mha(nw):
        out, w, _, m = torch_mha(X, KV, KV, nw, dropout=p)
        return "returns no weights" if w is None else _row_sums(w)

    def sd():
        return "returns no weights"

    def hf():
        import torch
        from transformers.models.bert.modeling_bert import eager_attention_forward

        module = torch.nn.Module().train()
        _, w = eager_attention_forward(module, _t(Q4), _t(K4), _t(V4), None, dropout=p)
        return _row_sums(w.detach().numpy())

    return {FRAMEWORKS[0]: lambda: mha(True), FRAMEWORKS[1]: lambda: mha(False), FRAMEWORKS[2]: sd, FRAMEWORKS[3]: hf}


def _row_sums(w) -> str:
    sums = np.asarray(w).sum(axis=-1)
    return "before dropout (rows sum to 1)" if np.allclose(sums, 1) else "after dropout (rows do not sum to 1)"


VERIFY_CASES = [
    (
        "verify: is_causal=True with Lq = 3 < Lk = 4 (a KV cache)",
        "bottom-right: query i sees keys j <= i + Lk - Lq",
        verified({"is_causal": True}),
    ),  # fmt: skip
    (
        "verify: a row fully masked by finfo.min (float mask), forward and backward",
        "uniform weights 1/Lk and their exact gradients (a finite mask is a bias)",
        verified({"mask": "blocked rows", "form": "finfo.min", "dtype": "float32"}, finite_min_row_gradient),
    ),  # fmt: skip
    (
        "verify: a row fully masked by a bool mask, forward and backward",
        "zero weights, zero output, zero gradients",
        verified({"mask": "blocked rows"}),
    ),  # fmt: skip
    (
        "verify: returned attention weights with dropout p = 0.5",
        "before dropout (the cache's attn_weights; the dropped ones are attn_weights * dropout_mask / (1 - p))",
        dropout_weights(),
    ),  # fmt: skip
]
CASES += VERIFY_CASES


def ours_measured(title: str) -> str:
    """What mha_numpy's MultiHeadAttention does now on the same case (``--measure-ours``), for the lead's check."""
    from mha_numpy import MultiHeadAttention

    def forward(x=X, kv=KV, mask=None, **kw):
        mha = MultiHeadAttention(kw.pop("E", E), kw.pop("H", H), rng=0, **kw)
        out, cache = mha.forward(x, kv, kv, mask=mask)
        g = mha.backward(np.ones_like(out), cache)
        return out, cache, g, mha

    def empty(Bn, Lqn, Lkn):
        out, _, g, mha = forward(np.ones((Bn, Lqn, E)), np.ones((Bn, Lkn, E)))
        is_bias = out.size and np.allclose(out, mha.params["b_o"])
        return f"output {'= b_o' if is_bias else rows_state(out)}, d query {rows_state(g['query'])}"

    def masked(value):
        keep = np.ones((Lq, Lk), bool)
        keep[0] = False
        _, cache, g, _ = forward(mask=keep if value is None else np.where(keep, 0.0, value))
        return f"weights {row_kind(cache.attn_weights[0, 0, 0])}, d query {rows_state(g['query'][:, :1])}"

    def nan_at(which):
        x, kv, add = X.copy(), KV.copy(), np.zeros((Lq, Lk))
        if which == "query":
            x[:, 0, 0] = np.nan
        elif which == "key":
            kv[:, 0, 0] = np.nan
        else:
            add[0, 0] = np.inf
        return f"output {rows_state(forward(x, kv, mask=add)[0])}"

    runs = {
        "Lk = 0": lambda: empty(B, Lq, 0),
        "Lq = 0": lambda: empty(B, 0, Lk),
        "B = 0": lambda: empty(0, Lq, Lk),
        "head dim 0": lambda: forward(E=2, H=4) and "accepted",
        "NaN in one query": lambda: nan_at("query"),
        "NaN in one key": lambda: nan_at("key"),
        "+inf score": lambda: nan_at("+inf"),
        "row fully masked by a bool": lambda: masked(None),
        "row fully masked by -inf": lambda: masked(-np.inf),
        "row fully masked by finfo.min": lambda: masked(np.finfo(np.float64).min),
        "row fully masked by -1e9": lambda: masked(-1e9),
        "integer 0/1 mask": lambda: forward(mask=np.ones((Lq, Lk), np.int64)) and "accepted",
        "mask of the wrong shape": lambda: forward(mask=np.ones((Lq, Lk + 1), bool)) and "accepted",
        "dropout 1.5": lambda: forward(dropout=1.5) and "accepted",
    }

    def causal(Lq_, Lk_):
        from mha_numpy import masks

        x, kv = RNG.standard_normal((B, Lq_, E)), RNG.standard_normal((B, Lk_, E))
        cells = []
        for align in ("top-left", "bottom-right"):
            _, cache, g, _ = forward(x, kv, mask=masks.causal_mask(Lq_, Lk_, align=align, structured=True))
            dead = ~masks.causal_mask(Lq_, Lk_, align=align).any(-1)
            rows = f", rows without a key: weights {row_kind(cache.attn_weights[0, 0, dead])}" if dead.any() else ""
            cells.append(f"{align}{rows}")
        return "; ".join(cells)

    def documents():
        from mha_numpy import masks

        x = RNG.standard_normal((B, 4, E))
        _, cache, g, _ = forward(x, x, mask=masks.document_mask([2, 1], causal=True, L=4, structured=True))
        return f"weights {row_kind(cache.attn_weights[0, 0, 3])}, d query {rows_state(g['query'][:, 3:])}"

    runs["causal with Lq = 3 < Lk = 4"] = lambda: causal(3, 4)
    runs["causal with Lq = 4 > Lk = 3"] = lambda: causal(4, 3)
    runs["fully masked document row"] = documents
    run = next((f for prefix, f in runs.items() if title.startswith(prefix)), None)
    return attempt(run) if run else "(not measured here: tests/)"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--measure-ours", action="store_true", help="add a column: mha_numpy measured now")
    args = p.parse_args(argv)
    try:
        import torch
        import transformers
    except ImportError as e:
        print(f"needs torch and transformers (pip install -r requirements-dev.txt): {e}", file=sys.stderr)
        return 2
    head = ["case", "mha_numpy (documented)", *(["mha_numpy (measured now)"] if args.measure_ours else []), *FRAMEWORKS]
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, numpy {np.__version__}\n")
    print("| " + " | ".join(head) + " |")
    print("|" + " --- |" * len(head))
    for title, ours, measured in CASES:
        cells = [title, ours, *([ours_measured(title)] if args.measure_ours else [])]
        cells += [attempt(measured[f]) for f in FRAMEWORKS]
        print("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
