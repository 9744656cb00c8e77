"""verify safe to trust with a CI's exit code (issue 35): a function that writes into its inputs is judged against
the reference of the untouched inputs and fails for the writing, by name; a function that exits (sys.exit,
os._exit) or hangs fails its case with a message, and the command still prints its report and exits 1."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
from helpers import require_torch

from mha_numpy import testing as T
from mha_numpy.testing.cases import shrink

ROOT = Path(__file__).resolve().parents[1]
SMALL = [shrink(c) for c in T.matrix("quick")]
PLAIN = [c for c in SMALL if c.dtype in ("float64", "float32") and not c.needs() - {"backward"}]  # no mask, ...
MASKED = [c for c in SMALL if c.dtype == "float64" and c.mask is not None and c.form == "bool" and not c.needs() - {
          "backward", "mask"}][:2]  # fmt: skip


def correct():
    spec = importlib.util.spec_from_file_location("verify_trust_correct", ROOT / "examples" / "verify" / "correct.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --------------------------------------------------------------------------- a function that writes into its inputs


def zero_q_k_mean_of_v(q, k, v):
    """q and k zeroed in place: the scores are 0, the weights uniform, the output the mean of v over the keys,
    which is what the reference of the zeroed inputs gives."""
    q[...] = 0
    k[...] = 0
    return np.broadcast_to(v.mean(axis=2, keepdims=True), q.shape[:3] + v.shape[-1:]).copy()  # (B, H, Lq, d)


def test_a_numpy_function_that_zeroes_q_and_k_fails_for_writing_into_them():
    report = T.verify_attention(zero_q_k_mean_of_v, cases=PLAIN)
    assert not report.passed, str(report)
    ran = [r for r in report.results if r.status != "n/a"]
    assert len(ran) >= 6 and all(r.status == "FAIL" and r.written == ("q", "k") for r in ran), str(report)
    assert all("wrote into its input q, k" in r.message and "wrong: out" in r.message for r in ran)
    text = str(report)
    assert f"{len(ran)} cases wrote into the function's inputs (q, k)" in text and "a bug" not in text
    assert report.to_dict()["results"][0]["written"] == ["q", "k"]


def test_a_correct_numpy_function_that_scribbles_on_q_afterwards_fails_for_that_alone():
    attention = correct().attention

    def scribbles(q, k, v, **kw):
        out = attention(q, k, v, **kw)
        q += 1.0
        return out

    report = T.verify_attention(scribbles, cases=PLAIN + MASKED)
    ran = [r for r in report.results if r.status != "n/a"]
    assert len(ran) >= 8 and all(r.status == "FAIL" and r.written == ("q",) for r in ran), str(report)
    assert all(r.message.endswith("(what it returned is right)") for r in ran), str(report)
    assert all(c.passed for r in ran for c in r.checks.values())  # judged against the untouched q


def test_a_mask_written_into_is_seen_through_a_converted_copy():
    """The "ignore" convention hands the function a new mask (~ours): the adapter checks what it handed."""
    attention = correct().attention

    def clears_its_mask(q, k, v, mask=None):
        out = attention(q, k, v, mask=None if mask is None else ~mask)
        mask[...] = False
        return out

    report = T.verify_attention(clears_its_mask, cases=MASKED, mask_convention="ignore")
    assert [r.written for r in report.results] == [("mask",)] * len(MASKED), str(report)


def test_a_function_that_leaves_its_inputs_alone_still_passes():
    attention = correct().attention
    report = T.verify_attention(attention, correct().attention_vjp, cases=PLAIN + MASKED)
    assert report.passed and not any(r.written for r in report.results), str(report)


def test_torch_tensors_share_the_memory_and_are_checked_too():
    torch = require_torch()
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def zeroes(q, k, v):
        with torch.no_grad():
            q.zero_()
            k.zero_()
        return v.mean(dim=2, keepdim=True).expand(*q.shape[:3], v.shape[-1])

    bf16 = [c for c in SMALL if c.dtype == "bfloat16" and not c.needs() - {"backward"}]  # a copy: the adapter's
    cases = [c for c in PLAIN if c.dtype == "float64"] + bf16
    report = T.verify_attention(T.from_torch(zeroes, without=("backward",)), cases=cases)
    assert [r.written for r in report.results] == [("q", "k")] * len(cases), str(report)
    assert all(r.status == "FAIL" for r in report.results)

    def scribbles(q, k, v):
        out = sdpa(q, k, v)
        with torch.no_grad():
            q.add_(1.0)
        return out

    forward = T.verify_attention(T.from_torch(scribbles, without=("backward",)), cases=cases)
    assert [r.written for r in forward.results] == [("q",)] * len(cases), str(forward)
    assert all(r.message.endswith("(what it returned is right)") for r in forward.results), str(forward)
    both = T.verify_attention(T.from_torch(scribbles), cases=cases[:1])  # autograd refuses the written q: an ERROR
    assert both.results[0].status == "ERROR" and both.results[0].message.startswith("wrote into q, then raised")
