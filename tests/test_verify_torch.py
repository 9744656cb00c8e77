"""mha_numpy.testing on the real torch implementations (issue 23): the matrix finds their documented differences
(docs/verify.md) and nothing else, and a torch function of a user's own passes or is named. SDPA runs on the quick
matrix itself; the others on it shrunk (``cases.shrink``: the same cases, sequences / 16), to stay cheap."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import require_torch

from mha_numpy import testing as T
from mha_numpy.testing.cases import shrink
from mha_numpy.testing.conventions import blocked_rows, effective_mask

QUICK = T.matrix("quick")
SMALL = [shrink(c) for c in QUICK]


@pytest.fixture(scope="module")
def torch():
    """torch on one thread here, restored after: its thread pool only costs on cases this small (measured 0.2 s
    instead of 3.5 s wall for the shrunk matrix on a busy 2-core machine)."""
    torch = require_torch()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield torch
    torch.set_num_threads(threads)


def failures(report) -> dict:
    return {r.case.id: r.detected for r in report.results if r.failed}


def has_blocked_rows(case) -> bool:
    return bool(blocked_rows(effective_mask(case.inputs().mask, case), (case.B, case.H, case.Lq, case.Lk)).any())


def causal_kv_cache(case) -> bool:
    return case.is_causal and case.Lq != case.Lk


def test_sdpa_math_differs_only_in_the_alignment_of_is_causal(torch):
    sdpa = T.from_torch(torch.nn.functional.scaled_dot_product_attention, sdpa_backend="math")
    report = T.verify_attention(sdpa, cases=SMALL)
    found = failures(report)
    assert set(found) == {c.id for c in SMALL if causal_kv_cache(c)}, str(report)
    assert set(found.values()) == {"causal top-left"}
    na = {r.case.id: r.message for r in report.results if r.status == "n/a"}
    assert na == {c.id: "takes no dropout" for c in SMALL if c.dropout_p}  # its dropout is sampled inside
    real = T.verify_attention(sdpa, only="is_causal")  # the quick matrix's own shapes, up to 1023 x 1024
    assert set(failures(real)) == {c.id for c in QUICK if causal_kv_cache(c) and c.dtype in sdpa.dtypes}


@pytest.mark.parametrize("need_weights", [True, False])
def test_torch_mha_differs_only_in_nan_rows_on_its_need_weights_path(torch, need_weights):
    report = T.verify_attention(T.from_torch(torch.nn.MultiheadAttention, need_weights=need_weights), cases=SMALL)
    found = failures(report)
    nan = {c.id for c in SMALL if has_blocked_rows(c) and c.form in ("bool", "-inf") and not c.needs() - {
           "mask", "backward"}}  # fmt: skip
    assert set(found) == (nan if need_weights else set()), str(report)
    assert set(found.values()) <= {"NaN rows"}
    ran = [r for r in report.results if r.status != "n/a"]
    assert all(not (r.case.needs() - {"mask", "backward"}) for r in ran)  # no scale, is_causal, dropout, GQA
    assert {r.case.dtype for r in ran} == {"float64", "float32", "float16", "bfloat16"}
    assert all("weights" in r.checks for r in ran) == need_weights  # its per-head weights are judged too


def test_hf_sdpa_attention_differs_only_in_the_alignment_of_is_causal_but_not_for_one_query(torch):
    """transformers' sdpa_attention_forward passes is_causal to SDPA only when Lq > 1: a decoding step (one query
    against a KV cache) is right, a chunk of several queries is top-left."""
    report = T.verify_attention(T.hf_attention("sdpa"), cases=SMALL)
    found = failures(report)
    assert set(found) == {c.id for c in SMALL if causal_kv_cache(c) and c.Lq > 1}, str(report)
    assert set(found.values()) == {"causal top-left"}


def test_hf_eager_attention_gives_uniform_rows_and_a_float32_softmax(torch):
    """Llama's eager_attention_forward with the finfo.min mask transformers builds for it: a fully masked row is
    uniform (NaN with a -inf mask), and float64 inputs get a float32 softmax (softmax(..., dtype=torch.float32)),
    where float64's finfo.min becomes -inf: its fully masked rows are NaN."""
    report = T.verify_attention(T.hf_attention("eager"), cases=SMALL)
    found = failures(report)
    for r in report.results:
        c = r.case
        if r.status == "n/a":
            assert c.is_causal or c.dropout_p, c.id  # it takes no is_causal; its dropout is sampled inside
        elif c.dtype == "float64":
            rows = ["NaN rows"] if has_blocked_rows(c) else []
            assert r.failed and r.detected.split(" + ") == [*rows, "float32 inside"], (c.id, r.detected)
        elif has_blocked_rows(c) and c.mask:
            assert found.get(c.id) == ("NaN rows" if c.form == "-inf" else "uniform rows"), (c.id, found.get(c.id))
        else:
            assert r.status in ("PASS", "n/a"), (c.id, r.status, r.message)


def test_the_default_cpu_sdpa_kernels_backward_is_wrong_on_a_row_masked_by_finfo_min(torch):
    """docs/edge-cases.md: torch's CPU flash kernel recomputes the weights as exp(s - lse), and lse = finfo.min +
    log(Lk) rounds to finfo.min: each weight 1 instead of 1/Lk, the row's query gradient Lk times too large. The math
    backend is right. When this test fails, torch has fixed it: update the docs."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    rng = np.random.default_rng(0)
    Lq, Lk = 4, 6
    q, k, v = (torch.from_numpy(rng.standard_normal((1, 1, n, 8)).astype(np.float32)).requires_grad_() for n in
               (Lq, Lk, Lk))  # fmt: skip
    mask = torch.zeros(Lq, Lk)
    mask[1] = torch.finfo(torch.float32).min  # query 1 sees nothing
    d_out = torch.from_numpy(rng.standard_normal((1, 1, Lq, 8)).astype(np.float32))

    def dq(backend):
        with sdpa_kernel([backend]):
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            return out, torch.autograd.grad(out, q, d_out)[0]

    (out_math, dq_math), (out_flash, dq_flash) = dq(SDPBackend.MATH), dq(SDPBackend.FLASH_ATTENTION)
    assert torch.allclose(out_math, out_flash, atol=1e-6)  # the forward is the uniform softmax on both
    assert torch.allclose(dq_flash[0, 0, 1], Lk * dq_math[0, 0, 1], rtol=1e-2)
    assert torch.allclose(dq_flash[0, 0, 0], dq_math[0, 0, 0], atol=1e-5)  # the other rows are right


# --------------------------------------------------------------------------- a torch function of a user's own


def user_attention(torch, bug=None):
    def attention(q, k, v, mask=None, scale=None, is_causal=False, dropout_p=0.0, dropout_mask=None):
        H, Hkv = q.shape[1], k.shape[1]
        k, v = (x.repeat_interleave(H // Hkv, dim=1) for x in (k, v))
        s = q @ k.transpose(-1, -2) * (q.shape[-1] ** -0.5 if scale is None else scale)
        if mask is not None:
            s = s.masked_fill(mask if bug == "polarity" else ~mask, float("-inf")) if mask.dtype == torch.bool else (
                s + mask)  # fmt: skip
        if is_causal:
            Lq, Lk = s.shape[-2:]
            s = s.masked_fill(torch.ones(Lq, Lk, dtype=torch.bool).tril(Lk - Lq).logical_not(), float("-inf"))
        if bug == "nan_to_num":
            p = torch.softmax(s, dim=-1).nan_to_num(0.0)  # a fully masked row: 0 forward, its backward still NaN
        else:
            empty = torch.isneginf(s).all(dim=-1, keepdim=True)  # (B, H, Lq, 1) rows with no key
            p = torch.softmax(s.masked_fill(empty, 0.0), dim=-1).masked_fill(empty, 0.0)  # 0 both ways
        if dropout_mask is not None:
            p = p * dropout_mask / (1 - dropout_p)
        return p @ v

    return attention


def test_a_users_plain_torch_attention_passes_in_every_dtype(torch):
    report = T.verify_attention(T.from_torch(user_attention(torch)), cases=SMALL)
    assert report.passed, str(report)
    assert report.counts()["PASS"] == len(SMALL)  # the dropout cases too: it takes a keep-mask


def test_a_users_torch_attention_with_the_mask_flipped_is_named(torch):
    masked = [c for c in SMALL if c.mask and c.dtype == "float32"]
    found = failures(T.verify_attention(T.from_torch(user_attention(torch, bug="polarity")), cases=masked))
    assert set(found) == {c.id for c in masked if c.mask != "bias" and c.form == "bool"}, found
    assert set(found.values()) == {"mask polarity"}, found


def test_nan_to_num_after_the_softmax_is_named_nan_gradient_rows(torch):
    """pytorch #41508: nan_to_num (or torch.where) after the softmax makes a fully masked row 0 in the forward, but
    the softmax's own backward is still NaN there, and dq of that row with it, when the mask was added (-inf); a
    bool mask through masked_fill is right, its backward zeroes the filled entries' gradient."""
    masked = [c for c in SMALL if c.mask and c.dtype == "float32"]
    found = failures(T.verify_attention(T.from_torch(user_attention(torch, bug="nan_to_num")), cases=masked))
    assert set(found) == {c.id for c in masked if has_blocked_rows(c) and c.form == "-inf"}, found
    assert set(found.values()) == {"NaN gradient rows"}, found


def test_from_torch_picks_the_adapter_and_refuses_an_option_that_does_not_apply(torch):
    assert T.from_torch(torch.nn.MultiheadAttention).mask_convention == "ignore"
    from transformers.models.llama.modeling_llama import eager_attention_forward

    assert T.from_torch(eager_attention_forward).mask_convention == "finite-min"
    sdpa = T.from_torch(torch.nn.functional.scaled_dot_product_attention)
    assert {"mask", "scale", "is_causal", "gqa", "backward"} <= sdpa.features  # read from its docstring
    with pytest.raises(ValueError, match="layout do not apply to torch_mha"):
        T.from_torch(torch.nn.MultiheadAttention, layout="blhd")
