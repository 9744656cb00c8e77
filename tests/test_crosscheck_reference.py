"""mha_numpy against PyTorch's saved numbers (tests/data/torch_reference.npz), without torch.

The fixture holds torch's and transformers' outputs, attention weights and gradients for fixed weights and
inputs (made by scripts/make_torch_reference.py, which never calls mha_numpy). The weights are stored under
torch's own names, so these tests also check our name maps. While they run, ``import torch`` and
``import transformers`` are made to fail: the checks prove they need neither.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import require_torch

from mha_numpy import MultiHeadAttention, masks
from mha_numpy import functional as F
from mha_numpy import torch_compat as tc

REF_PATH = Path(__file__).parent / "data" / "torch_reference.npz"
SCRIPT = Path(__file__).parents[1] / "scripts" / "make_torch_reference.py"
with np.load(REF_PATH, allow_pickle=False) as _f:
    REF = {k: _f[k] for k in _f.files}
CASES = [str(c) for c in REF["meta/cases"]]
RECORDS_NAN = "mha_fully_masked_row_need_weights"  # torch gives NaN there: checked on its own below


@pytest.fixture
def no_torch(monkeypatch):
    """Make `import torch` / `import transformers` raise ImportError for the duration of the test."""
    for name in ("torch", "transformers"):
        monkeypatch.setitem(sys.modules, name, None)


def group(case: str, prefix: str) -> dict[str, np.ndarray]:
    start = f"{case}/{prefix}/"
    return {k[len(start) :]: v for k, v in REF.items() if k.startswith(start)}


def config(case: str) -> dict:
    return json.loads(str(REF[f"{case}/config"]))


def run_ours(case: str):
    """Our output, attention weights and gradients (ours by our names, theirs mapped from torch names)."""
    cfg, w, x, d_out, out = (
        config(case),
        group(case, "w"),
        group(case, "in"),
        REF[f"{case}/d_output"],
        group(case, "out"),
    )
    dtype = np.dtype(cfg["dtype"])
    if cfg["kind"] == "sdpa":
        mask = masks.causal_mask(x["q"].shape[2], x["k"].shape[2]) if cfg["is_causal"] else x.get("attn_mask")
        ctx, cache = F.scaled_dot_product_attention_forward(x["q"], x["k"], x["v"], mask)
        grads = dict(zip("qkv", F.scaled_dot_product_attention_backward(d_out, cache)))
        theirs = {n: out[f"grad/{n}"] for n in "qkv"}
        return dtype, ctx, None, grads, theirs, {n: f"{n}.grad" for n in "qkv"}

    if cfg["kind"] == "mha":
        packed = cfg["kdim"] is None and cfg["vdim"] is None
        name_map = tc.torch_mha_name_map(cfg["E"], packed=packed, bias=cfg["bias"])
        mha = MultiHeadAttention(cfg["E"], cfg["H"], bias=cfg["bias"], kdim=cfg["kdim"], vdim=cfg["vdim"], dtype=dtype)
        mask = tc.mask_from_torch_mha(x.get("key_padding_mask"), x.get("attn_mask"), num_heads=cfg["H"])
        q = x["query"]
        k, v = (q, q) if cfg["self_attention"] else (x["key"], x["value"])
        leaves = ["query"] if cfg["self_attention"] else ["query", "key", "value"]
    else:  # hf_bert
        name_map = tc.HF_BERT_NAME_MAP
        mha = MultiHeadAttention(cfg["E"], cfg["H"], dtype=dtype)
        mask = masks.from_hf_attention_mask(x["attention_mask"])  # HF: 1 = keep
        q = k = v = x["hidden_states"]
        leaves = ["hidden_states"]
    mha.params = tc.params_from_state(w, name_map)
    output, cache = mha.forward(q, k, v, mask=mask)
    g = mha.backward(d_out, cache)
    grads = {n: g[n] for n in name_map}
    theirs = tc.params_from_state({n[len("grad/") :]: a for n, a in out.items() if n.startswith("grad/")}, name_map)
    labels = {n: tc.describe(e) for n, e in name_map.items()}
    if len(leaves) == 1:  # self-attention: the three input paths add up
        grads[leaves[0]] = g["query"] + g["key"] + g["value"]
    else:
        grads |= {n: g[n] for n in leaves}
    theirs |= {n: out[f"grad/{n}"] for n in leaves}
    labels |= {n: f"{n}.grad" for n in leaves}
    return dtype, output, cache.attn_weights, grads, theirs, labels


@pytest.mark.parametrize("case", [c for c in CASES if c != RECORDS_NAN])
def test_against_saved_torch_numbers(case, no_torch):
    dtype, output, weights, grads, theirs, labels = run_ours(case)
    out = group(case, "out")
    report = tc.CrosscheckReport(f"{case} vs torch {REF['meta/torch_version']}", dtype, tc.DEFAULT_RTOL[dtype])
    report.compare("output", "saved output", output, out["output"])
    if "attn_weights" in out:
        report.compare("attn_weights per head", "saved attn_weights", weights, out["attn_weights"])
    for name in grads:
        report.compare(f"dL/d{name}", labels[name], grads[name], theirs[name])
    assert report.passed, str(report)
    assert len(report.rows) == 1 + ("attn_weights" in out) + len(theirs)  # every saved gradient was compared


def test_fully_masked_rows_torch_need_weights_nan_and_ours_zero(no_torch):
    """torch 2.13, need_weights=True: NaN in the fully masked row, and NaN spreads into every gradient but
    dL/d out_proj.bias. We give zero weights (output = b_o there) and match torch on every other row."""
    case = RECORDS_NAN
    dtype, output, weights, grads, theirs, _ = run_ours(case)
    out = group(case, "out")
    full = np.isnan(out["output"]).all(axis=-1)  # (B, Lq)
    assert full[:, 2].all() and not full[:, :2].any()  # exactly the query that may attend to nothing
    assert np.isnan(out["attn_weights"][:, :, 2]).all() and np.isfinite(out["attn_weights"][:, :, :2]).all()
    for name, g in theirs.items():
        assert np.isnan(g).any() == (name != "b_o"), name
    np.testing.assert_array_equal(weights[:, :, 2], 0.0)
    np.testing.assert_array_equal(output[:, 2], np.broadcast_to(REF[f"{case}/w/out_proj.bias"], (2, 8)))
    np.testing.assert_allclose(output[:, :2], out["output"][:, :2], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(weights[:, :, :2], out["attn_weights"][:, :, :2], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(grads["b_o"], theirs["b_o"], rtol=1e-10)


def test_sdpa_fully_masked_row_is_zero_like_ours(no_torch):
    out = group("sdpa_fully_masked_row", "out")
    np.testing.assert_array_equal(out["output"][:, :, 1], 0.0)  # SDPA: query 1 may attend to nothing -> 0
    _, output, *_ = run_ours("sdpa_fully_masked_row")
    np.testing.assert_array_equal(output[:, :, 1], 0.0)


def test_reference_file_is_small_and_records_versions():
    assert REF_PATH.stat().st_size < 1_000_000
    assert str(REF["meta/torch_version"]).startswith("2.")
    assert str(REF["meta/transformers_version"])
    kinds = {config(c)["kind"] for c in CASES}
    dtypes = {config(c)["dtype"] for c in CASES}
    assert kinds == {"mha", "sdpa", "hf_bert"} and dtypes == {"float32", "float64"}
    assert sum("key_padding_mask" in group(c, "in") or "attn_mask" in group(c, "in") for c in CASES) >= 6


def case_scale(case: str) -> float:
    """The largest finite magnitude among a case's saved outputs and gradients."""
    values = [np.abs(v[np.isfinite(v)]) for k, v in REF.items() if k.startswith(f"{case}/out/")]
    return max((float(v.max()) for v in values if v.size), default=0.0)


def regeneration_tolerance(key: str, value: np.ndarray) -> float:
    """Absolute tolerance for one regenerated tensor: the cross-check rtol times its own scale, plus a floor
    of 1000 ulp of the case's largest tensor. A tensor that is zero in theory (dL/d b_k) is rounding noise
    whose size depends on the CPU's kernels (AVX2 vs AVX-512), so it is judged against the largest one."""
    case = key.split("/", 1)[0]
    finite = np.abs(value[np.isfinite(value)])  # the NaN case stores all-NaN gradients
    own = float(finite.max()) if finite.size else 0.0
    return tc.DEFAULT_RTOL[value.dtype] * own + 1000 * float(np.finfo(value.dtype).eps) * case_scale(case)


def test_regeneration_tolerance_judges_zero_tensors_against_the_case():
    """The AVX-512 failure: dL/d self.key.bias is ~1e-17 noise on both sides; a tolerance relative to its
    own maximum (~1e-26) failed it. Against the case's largest gradient the noise passes, a real error not."""
    key = next(k for k in REF if k.endswith("/out/grad/self.key.bias") and REF[k].dtype == np.float64)
    noise = REF[key] + 1e-16 * np.random.default_rng(0).standard_normal(REF[key].shape)
    tol = regeneration_tolerance(key, REF[key])
    assert np.abs(noise - REF[key]).max() <= tol
    assert tol < 1e-9 * case_scale(key.split("/", 1)[0])  # still far below any real error


def test_script_regenerates_the_reference():
    """The script in the repo reproduces the committed file: inputs bit for bit, torch's numbers to the
    cross-check tolerance of their dtype (another CPU or BLAS may round the last bits differently)."""
    require_torch()
    pytest.importorskip("transformers", reason="transformers is not installed: pip install -r requirements-dev.txt")
    spec = importlib.util.spec_from_file_location("make_torch_reference", SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    fresh = script.build()
    assert sorted(fresh) == sorted(REF)
    for key, value in REF.items():
        if "/out/" in key:
            tol = regeneration_tolerance(key, value)
            np.testing.assert_allclose(fresh[key], value, rtol=0, atol=tol, err_msg=key)
        elif not key.startswith("meta/"):
            np.testing.assert_array_equal(fresh[key], value, err_msg=key)
