"""mha_numpy.torch_compat: name maps, weight import/export, mask converters and the cross-checks.

Everything that needs torch asks for it through the ``torch`` fixture (helpers.require_torch), so a missing
torch gives a skip with a reason locally and a failure under CI. The expected numbers always come from
torch / transformers, never from our own code.
"""

from __future__ import annotations

import itertools
import subprocess
import sys

import numpy as np
import pytest
from helpers import require_torch

from mha_numpy import MultiHeadAttention, masks
from mha_numpy import torch_compat as tc

E, H = 8, 2


@pytest.fixture
def torch():
    t = require_torch()
    t.set_num_threads(1)  # tensors here are tiny: a thread pool only adds waiting on a busy 2-core machine
    return t


@pytest.fixture
def transformers(torch):
    return pytest.importorskip(
        "transformers", reason="transformers is not installed: pip install -r requirements-dev.txt"
    )


def make_torch_mha(torch, *, bias=True, kdim=None, vdim=None, batch_first=True, dtype="float64", seed=0):
    """A torch MHA with torch's own initialisation, plus nonzero biases (zero biases hide bias bugs)."""
    torch.manual_seed(seed)
    m = torch.nn.MultiheadAttention(
        E, H, bias=bias, kdim=kdim, vdim=vdim, batch_first=batch_first, dtype=getattr(torch, dtype)
    )
    with torch.no_grad():
        for name, p in m.named_parameters():
            if "bias" in name:
                p.normal_(0.0, 0.5)
    return m


def torch_masks(kind: str, mask_dtype: str, B: int, Lq: int, Lk: int, rng):
    """(key_padding_mask, attn_mask) in torch MHA's convention: bool True = ignore, or float added."""
    lengths = np.array([Lk] + [Lk - 1 - (b % (Lk - 1)) for b in range(1, B)])  # all >= 1
    ignore_pad = np.arange(Lk)[None, :] >= lengths[:, None]  # (B, Lk) True = padding
    ignore_causal = ~np.tril(np.ones((Lq, Lk), dtype=bool))  # (Lq, Lk) True = future key
    kpm = ignore_pad if "padding" in kind else None
    am = ignore_causal if "causal" in kind else None
    if mask_dtype == "float":
        kpm = None if kpm is None else np.where(kpm, -np.inf, 0.0)
        # a float attn_mask may also carry a real bias, not only 0 / -inf
        am = None if am is None else np.where(am, -np.inf, rng.normal(0.0, 1.0, am.shape))
    return kpm, am


MHA_ROWS = {"output", "Q", "K", "V", "scores", "context", "torch ops ≡ module", "dL/dquery", "dL/dkey", "dL/dvalue"}


# --------------------------------------------------------------------------- no torch needed


def test_the_harness_compares_the_declared_rows_in_order():
    """``harness.compare``, the one loop of every cross-check: a row a declared Row, in order; a row whose other
    side is missing becomes its note; a ``reference`` row checks ours against ours; gradient rows come from a name
    map. The numbers are written by hand here."""
    from mha_numpy.interop import harness

    name_map = {"W_q": ("in_proj_weight", slice(0, 2)), "b_o": ("out_proj.bias", None)}
    rows = (
        harness.Row("output", "module(...)", "y"),
        harness.Row("weights", "module(...)[1]", "w", missing="no weights: need_weights=False"),
        harness.Row("cached ≡ full", "ours, one forward", "y", reference="full", note="ours vs ours"),
        *harness.grad_rows(name_map),
    )
    ours = {"y": np.array([1.0, 2.0]), "full": np.array([1.0, 2.5]), "w": np.ones(2)}
    ours.update(harness.our_grads({"W_q": np.array([[4.0]]), "b_o": np.array([0.0, 0.0])}))
    theirs = {"y": np.array([1.0, 2.25]), "w": None}
    theirs.update(harness.theirs_grads({"in_proj_weight": np.array([[4.0], [2.0], [9.0]]), "out_proj.bias": [0, 0]},
                                       {"W_q": ("in_proj_weight", slice(0, 1)), "b_o": name_map["b_o"]}))  # fmt: skip
    report = harness.compare("title", np.float64, 1e-10, rows, ours, theirs, ["a note"])
    assert [r.name for r in report.rows] == ["output", "cached ≡ full", "dL/dW_q", "dL/db_o"]
    assert [r.theirs for r in report.rows[2:]] == ["in_proj_weight[0:2]", "out_proj.bias"]
    assert report["output"].max_abs_err == 0.25 and report["output"].max_rel_err == 0.25 / 2.25
    assert report["cached ≡ full"].max_abs_err == 0.5 and report["cached ≡ full"].note == "ours vs ours"
    assert report["dL/dW_q"].max_abs_err == 0.0 and report["dL/db_o"].zero
    assert report.notes == ["no weights: need_weights=False", "a note"] and not report.passed


def test_every_crosscheck_goes_through_the_one_harness_and_fits_in_40_lines():
    """interop/ grew by copying its comparison loop per model (issue 34): only ``report`` and ``harness`` build a
    CrosscheckReport, every module with a public crosscheck_* calls ``compare`` (or decoder_attention's checks, which
    do), and no function is over 40 lines."""
    import ast
    from pathlib import Path

    import mha_numpy.interop as interop

    builders, checks, long = set(), set(), []
    for path in sorted(Path(interop.__file__).parent.glob("*.py")):
        tree = ast.parse(path.read_text())
        calls = {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
        functions = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]
        if "CrosscheckReport" in calls:
            builders.add(path.stem)
        if any(f.name.startswith("crosscheck_") for f in functions) and not any(
            c == "compare" or c.startswith("crosscheck_decoder_")
            for c in calls  # gemma2, qwen3: decoder_attention's
        ):
            checks.add(path.stem)
        long += [f"{path.stem}.{f.name}: {f.end_lineno - f.lineno + 1}" for f in functions
                 if f.end_lineno - f.lineno + 1 > 40]  # fmt: skip
    assert builders == {"harness"} and not checks and not long, (builders, checks, long)


def test_import_does_not_import_torch():
    code = "import sys, mha_numpy, mha_numpy.torch_compat; assert 'torch' not in sys.modules, 'torch was imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_missing_torch_gives_import_error_naming_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # makes `import torch` raise ImportError
    with pytest.raises(ImportError, match=r"mha_numpy.interop.*package 'torch'.*mha_numpy\[torch\]"):
        tc.to_torch_mha(MultiHeadAttention(E, H, rng=0))
    with pytest.raises(ImportError, match=r"package 'torch'.*mha_numpy\[torch\]"):
        tc.crosscheck_sdpa(np.zeros((1, 1, 2, 2)), np.zeros((1, 1, 2, 2)), np.zeros((1, 1, 2, 2)))


def test_old_and_new_module_names_export_the_same_public_names():
    """torch_compat is the first name of interop, a plain re-export of it (it was a sys.modules swap of the same module
    until the data-path issue asked for plain re-exports): the same objects under the same names."""
    import mha_numpy.interop

    assert tc.__all__ == mha_numpy.interop.__all__ and tc.names is mha_numpy.interop.names
    assert all(getattr(tc, name) is getattr(mha_numpy.interop, name) for name in tc.__all__)
    for name in tc.__all__:
        assert getattr(tc, name) is not None, name
    used = ["CrosscheckReport", "DEFAULT_RTOL", "HF_BERT_NAME_MAP", "crosscheck_hf_bert_attention", "crosscheck_sdpa"]
    used += ["crosscheck_torch_mha", "describe", "from_hf_bert_attention", "from_torch_mha", "mask_from_hf"]
    used += ["mask_from_sdpa", "mask_from_torch_mha", "mask_to_hf", "mask_to_sdpa", "mask_to_torch_mha"]
    used += ["params_from_state", "to_torch_mha", "torch_mha_name_map"]
    assert set(used) <= set(tc.__all__)


def test_name_map_packed_is_torch_documented_layout():
    # torch documents in_proj_weight as the packed [W_q; W_k; W_v] (3E, E), in_proj_bias likewise
    got = tc.torch_mha_name_map(E, packed=True, bias=True)
    assert got == {
        "W_q": ("in_proj_weight", slice(0, 8)),
        "W_k": ("in_proj_weight", slice(8, 16)),
        "W_v": ("in_proj_weight", slice(16, 24)),
        "W_o": ("out_proj.weight", None),
        "b_q": ("in_proj_bias", slice(0, 8)),
        "b_k": ("in_proj_bias", slice(8, 16)),
        "b_v": ("in_proj_bias", slice(16, 24)),
        "b_o": ("out_proj.bias", None),
    }
    separate = tc.torch_mha_name_map(E, packed=False, bias=False)
    assert separate == {
        "W_q": ("q_proj_weight", None),
        "W_k": ("k_proj_weight", None),
        "W_v": ("v_proj_weight", None),
        "W_o": ("out_proj.weight", None),
    }


def test_params_from_state_picks_the_right_rows():
    packed = np.arange(3 * E * E, dtype=np.float64).reshape(3 * E, E)  # row r holds r*E ... r*E + E - 1
    state = {"in_proj_weight": packed, "out_proj.weight": -np.eye(E), "in_proj_bias": np.arange(3 * E)}
    state["out_proj.bias"] = np.full(E, 7.0)
    p = tc.params_from_state(state, tc.torch_mha_name_map(E))
    assert p["W_q"][0, 0] == 0 and p["W_k"][0, 0] == E * E and p["W_v"][0, 0] == 2 * E * E
    assert p["b_q"][0] == 0 and p["b_k"][0] == E and p["b_v"][0] == 2 * E and p["b_o"][0] == 7
    p["W_q"][0, 0] = 99.0  # copies, not views into the state
    assert packed[0, 0] == 0
    with pytest.raises(KeyError, match="in_proj_bias"):
        tc.params_from_state({"in_proj_weight": packed, "out_proj.weight": np.eye(E)}, tc.torch_mha_name_map(E))


def test_hf_extended_mask_converters_without_torch():
    ours = masks.combine_masks(masks.padding_mask(np.array([3, 1])), masks.causal_mask(3))  # (B, 1, 3, 3)
    for dtype in (np.float32, np.float64):
        ext = masks.to_hf_extended_mask(ours, dtype)
        assert ext.dtype == dtype and ext.shape == ours.shape
        assert set(np.unique(ext)) == {0.0, np.finfo(dtype).min}  # finfo.min, not -inf, as HF does
        np.testing.assert_array_equal(masks.from_hf_extended_mask(ext), ours)
    with pytest.raises(ValueError, match="bool mask"):
        masks.to_hf_extended_mask(np.zeros((1, 3)))
    with pytest.raises(ValueError, match="floating"):
        masks.from_hf_extended_mask(np.zeros((1, 3), dtype=int))


# --------------------------------------------------------------------------- import / export


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("dims", [(None, None), (5, 7)])
def test_round_trip_numpy_torch_numpy_is_exact(torch, dtype, bias, dims):
    mha = MultiHeadAttention(E, H, bias=bias, kdim=dims[0], vdim=dims[1], dtype=np.dtype(dtype), rng=3)
    for name, p in mha.params.items():
        p[...] = np.random.default_rng(len(name)).standard_normal(p.shape)  # every weight distinct, biases nonzero
    module = tc.to_torch_mha(mha)
    assert module.batch_first and module._qkv_same_embed_dim == (dims == (None, None))
    back = tc.from_torch_mha(module)
    assert list(back.params) == list(mha.params)
    for name in mha.params:
        assert back.params[name].dtype == np.dtype(dtype)
        np.testing.assert_array_equal(back.params[name], mha.params[name], err_msg=name)
    # and torch -> numpy -> torch gives back the very same state dict
    again = tc.to_torch_mha(back)
    for (n1, t1), (n2, t2) in zip(module.state_dict().items(), again.state_dict().items()):
        assert n1 == n2 and torch.equal(t1, t2), n1


def test_from_torch_mha_keeps_configuration(torch):
    m = make_torch_mha(torch, kdim=5, vdim=7, batch_first=False, dtype="float32")
    m.dropout = 0.25
    mha = tc.from_torch_mha(m)
    assert (mha.embed_dim, mha.num_heads, mha.kdim, mha.vdim) == (E, H, 5, 7)
    assert mha.dtype == np.float32 and mha.dropout == 0.25 and mha.bias
    np.testing.assert_array_equal(mha.params["W_k"], m.k_proj_weight.detach().numpy())


def test_float16_is_refused_naming_the_dtypes_we_model(torch):
    m = torch.nn.MultiheadAttention(E, H, dtype=torch.float16)
    with pytest.raises(ValueError, match="float32 or np.float64, got float16"):
        tc.from_torch_mha(m)


def test_from_torch_mha_refuses_what_it_does_not_model(torch):
    # add_bias_kv and add_zero_attn were refused here until they became steps (tests/test_torch_mha_extras.py)
    assert tc.from_torch_mha(torch.nn.MultiheadAttention(E, H, add_bias_kv=True)).add_bias_kv
    assert tc.from_torch_mha(torch.nn.MultiheadAttention(E, H, add_zero_attn=True)).add_zero_attn
    with pytest.raises(ValueError, match="no num_kv_heads=1"):
        tc.to_torch_mha(MultiHeadAttention(E, H, num_kv_heads=1))
    with pytest.raises(ValueError, match="bfloat16"):
        tc.from_torch_mha(torch.nn.MultiheadAttention(E, H, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="MultiheadAttention"):
        tc.from_torch_mha(torch.nn.Linear(E, E))


# --------------------------------------------------------------------------- torch MHA cross-check matrix


MATRIX = [
    dict(dims=dims, bias=bias, kind=kind, mask_dtype=mdt, batch_first=(i // 2) % 2 == 0)
    for i, (dims, bias, kind, mdt) in enumerate(
        itertools.product(
            [(None, None), (5, 7)], [True, False], ["padding", "causal", "padding+causal"], ["bool", "float"]
        )
    )
]


def _run_mha_case(torch, case, dtype, need_weights, B=3, Lq=4, Lk=6, seed=0):
    kdim, vdim = case["dims"]
    m = make_torch_mha(torch, bias=case["bias"], kdim=kdim, vdim=vdim, batch_first=case["batch_first"], dtype=dtype)
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, Lq, E))
    k = rng.standard_normal((B, Lk, kdim or E))
    v = rng.standard_normal((B, Lk, vdim or E))
    kpm, am = torch_masks(case["kind"], case["mask_dtype"], B, Lq, Lk, rng)
    return tc.crosscheck_torch_mha(m, q, k, v, key_padding_mask=kpm, attn_mask=am, need_weights=need_weights)


@pytest.mark.parametrize("need_weights", [True, False])
@pytest.mark.parametrize(
    "case", MATRIX, ids=lambda c: "{dims}-bias{bias}-{kind}-{mask_dtype}-bf{batch_first}".format(**c)
)
def test_torch_mha_matrix_float64(torch, case, need_weights):
    report = _run_mha_case(torch, case, "float64", need_weights)
    assert report.passed, str(report)
    assert report.rtol == 1e-10
    names = {r.name for r in report.rows}
    expected = MHA_ROWS | {f"dL/d{p}" for p in ("W_q", "W_k", "W_v", "W_o")}
    expected |= {f"dL/d{p}" for p in ("b_q", "b_k", "b_v", "b_o")} if case["bias"] else set()
    expected |= {"attn_weights per head", "attn_weights averaged"} if need_weights else set()
    assert names == expected


@pytest.mark.parametrize("need_weights", [True, False])
@pytest.mark.parametrize(
    "case", MATRIX, ids=lambda c: "{dims}-bias{bias}-{kind}-{mask_dtype}-bf{batch_first}".format(**c)
)
def test_torch_mha_matrix_float32(torch, case, need_weights):
    report = _run_mha_case(torch, case, "float32", need_weights)
    assert report.passed and report.rtol == 1e-5 and report.dtype == np.float32, str(report)


def test_torch_mha_self_attention_sums_the_three_paths(torch):
    m = make_torch_mha(torch)
    x = np.random.default_rng(1).standard_normal((2, 5, E))
    report = tc.crosscheck_torch_mha(m, x, x, x, key_padding_mask=np.array([[0, 0, 0, 0, 0], [0, 0, 0, 1, 1]], bool))
    assert report.passed, str(report)
    assert report["dL/dx (q+k+v paths)"].max_rel_err <= 1e-10


def test_crosscheck_accepts_our_module_and_torch_tensors(torch):
    mha = MultiHeadAttention(E, H, rng=2)
    mha.params["b_q"][...] = 0.3
    rng = np.random.default_rng(2)
    q, k = rng.standard_normal((2, 3, E)), rng.standard_normal((2, 4, E))
    kpm = torch.tensor([[False, False, False, False], [False, False, True, True]])
    report = tc.crosscheck_torch_mha(mha, q, k, k.copy(), key_padding_mask=kpm, attn_mask=torch.zeros(3, 4, dtype=bool))
    assert report.passed, str(report)


# --------------------------------------------------------------------------- the mapping itself


def test_swapped_name_map_is_detected(torch, monkeypatch):
    m = make_torch_mha(torch)
    x = np.random.default_rng(0).standard_normal((2, 4, E))
    assert tc.crosscheck_torch_mha(m, x, x + 1, x - 1).passed
    right = tc.torch_mha_name_map

    def swapped(*args, **kwargs):  # the classic bug: q and k blocks of in_proj_weight exchanged
        nm = right(*args, **kwargs)
        nm["W_q"], nm["W_k"] = nm["W_k"], nm["W_q"]
        return nm

    monkeypatch.setattr(tc.names, "torch_mha_name_map", swapped)
    report = tc.crosscheck_torch_mha(m, x, x + 1, x - 1)
    assert not report.passed
    for name in ("output", "attn_weights per head", "Q", "K", "dL/dquery", "dL/dW_q", "dL/dW_k"):
        assert not report[name].passed, name


def test_wrong_b_k_is_caught_only_by_the_intermediates(torch, monkeypatch):
    """Softmax ignores a shift shared by all keys, so b_k never reaches the output or any gradient:
    a mapping that loses b_k passes every output, weight and gradient row. Only K and scores catch it."""
    m = make_torch_mha(torch)
    right = tc.from_torch_mha

    def loses_b_k(module):
        mha = right(module)
        mha.params["b_k"] = np.zeros_like(mha.params["b_k"])
        return mha

    monkeypatch.setattr(tc.convert, "from_torch_mha", loses_b_k)
    x = np.random.default_rng(0).standard_normal((2, 4, E))
    report = tc.crosscheck_torch_mha(m, x, x + 1, x - 1)
    failed = {r.name for r in report.rows if not r.passed}
    assert failed == {"K", "scores"}, str(report)  # scores shift by q·Δb_k per query; softmax drops that shift


def test_swapped_hf_name_map_is_detected(transformers, monkeypatch):
    module = make_bert_attention(transformers)
    x = np.random.default_rng(0).standard_normal((2, 4, E))
    assert tc.crosscheck_hf_bert_attention(module, x).passed
    swapped = dict(tc.HF_BERT_NAME_MAP)
    swapped["W_v"], swapped["W_o"] = swapped["W_o"], swapped["W_v"]  # value.weight vs output.dense.weight
    monkeypatch.setattr(tc.names, "HF_BERT_NAME_MAP", swapped)
    report = tc.crosscheck_hf_bert_attention(module, x)
    assert not report["output"].passed and not report["V"].passed and not report["dL/dW_o"].passed


def test_head_order_matches_torch(torch):
    """Per-head weights of head h come from features h*d ... (h+1)*d-1 in both: zero head 1's query rows."""
    m = make_torch_mha(torch)
    with torch.no_grad():
        m.in_proj_weight[E // 2 : E] = 0.0  # W_q rows of head 1
        m.in_proj_bias[E // 2 : E] = 0.0
    x = torch.randn(1, 5, E, dtype=torch.float64)
    w = m(x, x, x, need_weights=True, average_attn_weights=False)[1].detach().numpy()  # (1, H, 5, 5)
    np.testing.assert_allclose(w[0, 1], 1 / 5, rtol=1e-14)  # head 1 has zero scores: uniform
    mha = tc.from_torch_mha(m)
    np.testing.assert_array_equal(mha.params["W_q"][E // 2 :], 0.0)
    assert np.abs(mha.params["W_q"][: E // 2]).max() > 0


# --------------------------------------------------------------------------- SDPA


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("mask_kind", ["none", "bool", "float", "is_causal", "padding+causal-bool"])
def test_sdpa(torch, dtype, mask_kind):
    rng = np.random.default_rng(4)
    B, Lq, Lk, d, dv = 2, 3, 5, 4, 6
    q, k = rng.standard_normal((B, H, Lq, d)).astype(dtype), rng.standard_normal((B, H, Lk, d)).astype(dtype)
    v = rng.standard_normal((B, H, Lk, dv)).astype(dtype)
    kw = {}
    if mask_kind == "bool":
        m = rng.random((B, 1, Lq, Lk)) < 0.6
        m[..., 0] = True
        kw["attn_mask"] = torch.from_numpy(m)  # SDPA: True = attend
    elif mask_kind == "float":
        kw["attn_mask"] = rng.normal(0, 1, (1, H, Lq, Lk)).astype(dtype)
    elif mask_kind == "is_causal":
        kw["is_causal"] = True
    elif mask_kind == "padding+causal-bool":
        kw["attn_mask"] = masks.combine_masks(masks.padding_mask(np.array([5, 2])), masks.causal_mask(Lq, Lk))
    report = tc.crosscheck_sdpa(q, k, v, **kw)
    assert report.passed, str(report)
    assert {r.name for r in report.rows} == {"output (context)", "attn_weights", "scores", "dL/dq", "dL/dk", "dL/dv"}


def test_sdpa_refuses_mask_and_is_causal(torch):
    z = np.zeros((1, 1, 2, 2))
    with pytest.raises(ValueError, match="is_causal"):
        tc.crosscheck_sdpa(z, z, z, attn_mask=np.ones((2, 2), bool), is_causal=True)


# --------------------------------------------------------------------------- Hugging Face BERT


def make_bert_attention(transformers, dtype="float64", seed=0):
    import torch
    from transformers.models.bert.modeling_bert import BertAttention

    cfg = transformers.BertConfig(
        hidden_size=E,
        num_attention_heads=H,
        intermediate_size=16,
        num_hidden_layers=1,
        vocab_size=16,
        attn_implementation="eager",
    )
    torch.manual_seed(seed)
    module = BertAttention(cfg).to(getattr(torch, dtype))
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("bias"):
                p.normal_(0.0, 0.5)
    return module


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("mask", ["none", "hf-padding", "extended-padding+causal"])
def test_hf_bert_attention(transformers, dtype, mask):
    module = make_bert_attention(transformers, dtype)
    B, L = 3, 5
    x = np.random.default_rng(5).standard_normal((B, L, E)).astype(dtype)
    am = None
    if mask == "hf-padding":
        am = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0]])  # HF: 1 = keep
    elif mask == "extended-padding+causal":
        ours = masks.combine_masks(masks.padding_mask(np.array([5, 4, 2])), masks.causal_mask(L))
        am = masks.to_hf_extended_mask(ours, dtype)  # (B, 1, L, L), 0 / finfo.min
    report = tc.crosscheck_hf_bert_attention(module, x, attention_mask=am)
    assert report.passed, str(report)
    assert report["BertAttention(x)"].passed and report["attn_weights per head"].passed
    assert module.training  # the check restores the module's mode


def test_our_hf_masks_equal_transformers_own(transformers):
    import torch
    from transformers.masking_utils import create_bidirectional_mask

    module = make_bert_attention(transformers)
    am = np.array([[1, 1, 1, 0], [1, 0, 0, 0]])
    x = torch.zeros(2, 4, E, dtype=torch.float64)
    theirs = create_bidirectional_mask(config=module.self.config, inputs_embeds=x, attention_mask=torch.from_numpy(am))
    ours = masks.to_hf_extended_mask(masks.from_hf_attention_mask(am), np.float64)  # (B, 1, 1, Lk)
    np.testing.assert_array_equal(np.broadcast_to(ours, theirs.shape), theirs.numpy())
    np.testing.assert_array_equal(
        masks.from_hf_extended_mask(theirs.numpy()), np.broadcast_to((am == 1)[:, None, None, :], (2, 1, 4, 4))
    )
    np.testing.assert_array_equal(tc.mask_to_hf(masks.from_hf_attention_mask(am)).numpy(), am)
    with pytest.raises(ValueError, match="other than 0 and finfo.min"):
        masks.from_hf_extended_mask(np.array([[0.0, -1.0]]))


def test_from_hf_bert_attention_maps_the_linears(transformers):
    module = make_bert_attention(transformers)
    mha = tc.from_hf_bert_attention(module)
    assert (mha.embed_dim, mha.num_heads, mha.bias, mha.dtype) == (E, H, True, np.float64)
    np.testing.assert_array_equal(mha.params["W_v"], module.self.value.weight.detach().numpy())
    np.testing.assert_array_equal(mha.params["b_o"], module.output.dense.bias.detach().numpy())
    with pytest.raises(ValueError, match="BertAttention"):
        tc.from_hf_bert_attention(module.output)


# --------------------------------------------------------------------------- masks: converters and pitfalls


def test_torch_mha_mask_converters_round_trip(torch):
    B, Lq, Lk = 2, 3, 4
    ours_pad = masks.padding_mask(np.array([4, 2]))  # (B, 1, 1, Lk)
    kpm, am = tc.mask_to_torch_mha(ours_pad, B, H)
    assert am is None and kpm.dtype == torch.bool
    np.testing.assert_array_equal(kpm.numpy(), [[False] * 4, [False, False, True, True]])  # True = ignore
    np.testing.assert_array_equal(tc.mask_from_torch_mha(key_padding_mask=kpm), ours_pad)
    causal = masks.causal_mask(Lq, Lk)
    kpm, am = tc.mask_to_torch_mha(causal, B, H)
    assert kpm is None and am.shape == (Lq, Lk)
    np.testing.assert_array_equal(am.numpy(), ~causal)
    both = masks.combine_masks(ours_pad, causal)  # (B, 1, Lq, Lk) -> (B*H, Lq, Lk)
    kpm, am = tc.mask_to_torch_mha(both, B, H)
    assert am.shape == (B * H, Lq, Lk)
    back = tc.mask_from_torch_mha(attn_mask=am, num_heads=H)
    np.testing.assert_array_equal(back, np.broadcast_to(both, (B, H, Lq, Lk)))
    np.testing.assert_array_equal(tc.mask_from_sdpa(tc.mask_to_sdpa(both)), both)


def test_mask_convention_pitfall_changes_the_output(torch):
    """Passing our mask (True = may attend) to torch MHA unconverted attends to exactly the wrong keys."""
    m = make_torch_mha(torch)
    x = torch.from_numpy(np.random.default_rng(0).standard_normal((2, 4, E)))
    ours = masks.padding_mask(np.array([4, 3]))
    right = m(x, x, x, key_padding_mask=tc.mask_to_torch_mha(ours, 2, H)[0])[1]
    wrong = m(x, x, x, key_padding_mask=torch.from_numpy(ours[:, 0, 0, :]))[1]  # averaged weights (B, Lq, Lk)
    assert torch.all(right[1, :, 3] == 0) and torch.all(wrong[1, :, :3] == 0)  # opposite keys get zero weight


# --------------------------------------------------------------------------- fully masked rows


def test_fully_masked_rows_ours_zero_like_sdpa(torch):
    rng = np.random.default_rng(6)
    q, k, v = (rng.standard_normal((2, H, 3, 4)) for _ in range(3))
    blocked = np.ones((2, 1, 3, 3), dtype=bool)
    blocked[0, 0, 1, :] = False  # query 1 of sequence 0 may attend to nothing
    for mask in (blocked, masks.to_additive(blocked)):
        report = tc.crosscheck_sdpa(q, k, v, attn_mask=mask)
        assert report.passed, str(report)
        out_t = torch.nn.functional.scaled_dot_product_attention(
            *map(torch.from_numpy, (q, k, v)), torch.from_numpy(mask)
        )
        assert torch.all(out_t[0, :, 1] == 0)  # SDPA gives exact zeros there (torch 2.13) ...
        from mha_numpy import functional as F

        ctx, cache = F.scaled_dot_product_attention_forward(q, k, v, mask)
        assert np.all(ctx[0, :, 1] == 0) and np.all(cache.attn_weights[0, :, 1] == 0)  # ... and so do we


def test_torch_mha_need_weights_true_gives_nan_on_fully_masked_rows(torch):
    """Records torch 2.13's behaviour (docs/crosscheck.md). If this fails, torch changed: update the docs."""
    m = make_torch_mha(torch)
    x = torch.from_numpy(np.random.default_rng(7).standard_normal((2, 3, E))).requires_grad_()
    am = torch.zeros(3, 3, dtype=torch.bool)
    am[2, :] = True  # query 2 ignores every key
    out, w = m(x, x, x, attn_mask=am, need_weights=True, average_attn_weights=False)
    assert torch.isnan(out[:, 2]).all() and torch.isfinite(out[:, :2]).all()
    assert torch.isnan(w[:, :, 2]).all() and torch.isfinite(w[:, :, :2]).all()
    # need_weights=False (the SDPA path, taken here because grad is enabled) gives zeros: b_o for the output
    out_f, w_f = m(x, x, x, attn_mask=am, need_weights=False)
    assert w_f is None
    np.testing.assert_array_equal(out_f[:, 2].detach().numpy(), np.broadcast_to(m.out_proj.bias.detach(), (2, E)))
    # ... and that is what we give, with gradients to 1e-10
    x_np = x.detach().numpy()
    report = tc.crosscheck_torch_mha(m, x_np, x_np, x_np, attn_mask=am, need_weights=False)
    assert report.passed, str(report)
    # the inference fast path (eval, no grad, self-attention, key_padding_mask, need_weights=False) gives NaN
    kpm = torch.tensor([[False, False, False], [True, True, True]])  # sequence 1: every key is padding
    m.eval()
    with torch.no_grad():
        xd = x.detach()  # the same object three times: the fast path checks `query is key is value`
        out_fast = m(xd, xd, xd, key_padding_mask=kpm, need_weights=False)[0]
    assert torch.isnan(out_fast[1]).all() and torch.isfinite(out_fast[0]).all()


def test_hf_fully_masked_rows_are_uniform(transformers):
    """HF adds finfo.min, not -inf: a fully masked row gets uniform weights 1/Lk. We give zeros with the
    converted bool mask, and reproduce HF exactly when given HF's float mask itself."""
    import torch

    module = make_bert_attention(transformers).eval()
    x = np.random.default_rng(8).standard_normal((2, 4, E))
    ext = masks.to_hf_extended_mask(np.array([True, True, True, True])[None, None, None, :].repeat(2, 0))
    ext[1] = np.finfo(np.float64).min  # sequence 1: every key blocked
    w_hf = module.self(torch.from_numpy(x), attention_mask=torch.from_numpy(ext))[1].detach().numpy()
    np.testing.assert_allclose(w_hf[1], 0.25, rtol=1e-15)
    mha = tc.from_hf_bert_attention(module)
    _, c_bool = mha.forward(x, x, x, mask=tc.mask_from_hf(ext))
    assert np.all(c_bool.attn_weights[1] == 0)
    _, c_float = mha.forward(x, x, x, mask=ext)
    np.testing.assert_allclose(c_float.attn_weights, w_hf, rtol=0, atol=1e-15)


# --------------------------------------------------------------------------- CLI


def test_cli_crosscheck_passes_and_prints_tables(torch, transformers, capsys):
    from mha_numpy.__main__ import main

    assert main(["crosscheck", "--mask", "padding+causal", "--lq", "3", "--lk", "4", "--kdim", "5", "--vdim", "6"]) == 0
    out = capsys.readouterr().out
    for title in ("torch.nn.MultiheadAttention", "scaled_dot_product_attention", "BertAttention", "float32"):
        assert title in out
    assert "FAIL" not in out


def test_cli_crosscheck_without_torch(monkeypatch, capsys):
    from mha_numpy.__main__ import main

    monkeypatch.setitem(sys.modules, "torch", None)
    assert main(["crosscheck"]) != 0
    assert "torch" in capsys.readouterr().err


def test_cli_crosscheck_exits_1_on_a_mismatch(torch, transformers, monkeypatch, capsys):
    from mha_numpy.__main__ import main

    right = tc.torch_mha_name_map

    def swapped(*args, **kwargs):
        nm = right(*args, **kwargs)
        nm["W_k"], nm["W_v"] = nm["W_v"], nm["W_k"]
        return nm

    monkeypatch.setattr(tc.names, "torch_mha_name_map", swapped)
    assert main(["crosscheck", "--dtype", "float64"]) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and "RESULT: MISMATCH" in out


def test_cli_crosscheck_fully_masked_row_explains_the_skipped_path(torch, transformers, capsys):
    from mha_numpy.__main__ import main

    assert main(["crosscheck", "--mask", "fully-masked-row", "--dtype", "float64"]) == 0
    out = capsys.readouterr().out
    assert "need_weights=True): not compared" in out and "gives NaN there" in out
    assert "PASS  torch.nn.MultiheadAttention (need_weights=False" in out


MASK_SHAPES = [(4,), (1, 4), (3, 1), (3, 4), (1, 1, 3, 4), (2, 1, 1, 4), (1, 1, 1, 4), (H, 3, 4), (1, H, 1, 4),
               (2, 1, 3, 1), (2, H, 3, 4)]  # fmt: skip


@pytest.mark.parametrize("kind", ["bool", "float32"])
@pytest.mark.parametrize("shape", MASK_SHAPES, ids=str)
def test_mask_to_torch_mha_emits_masks_torch_accepts_and_obeys(torch, shape, kind):
    """Issue 11, defect 9: broadcastable shapes, and float masks of another dtype, used to reach torch as is."""
    B, Lq, Lk = 2, 3, 4
    rng = np.random.default_rng(1)
    if kind == "bool":
        mask = rng.random(shape) < 0.6
        mask[..., :1] = True  # no fully masked row: torch's need_weights path gives NaN there
    else:
        mask = rng.normal(0, 1, shape).astype(np.float32)  # a float32 bias for a float64 module
    mha = MultiHeadAttention(E, H, rng=0)
    q, kv = rng.standard_normal((B, Lq, E)), rng.standard_normal((B, Lk, E))
    kpm, am = tc.mask_to_torch_mha(mask, B, H, query_len=Lq, key_len=Lk, dtype=np.float64)
    module = tc.to_torch_mha(mha)
    _, theirs = module(torch.from_numpy(q), torch.from_numpy(kv), torch.from_numpy(kv), key_padding_mask=kpm,
                       attn_mask=am, average_attn_weights=False)  # fmt: skip
    _, cache = mha.forward(q, kv, kv, mask=mask.astype(np.float64) if kind != "bool" else mask)
    np.testing.assert_allclose(theirs.detach().numpy(), cache.attn_weights, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(
    "mask, kwargs, match",
    [
        (np.ones((3, 4), dtype=np.int64), {}, "int64"),
        (np.ones((3, 4), dtype=object), {}, "object"),
        (np.ones((3, 5), bool), dict(key_len=4), r"does not broadcast"),
        (np.ones((3, 2, 3, 4), bool), {}, r"does not broadcast"),  # batch 3 for batch_size 2
        (np.ones((1, 2, 1, 3, 4), bool), {}, "1 to 4 dimensions"),
        (np.ones((3, 4), bool), dict(query_len=0), "query_len"),
    ],
)
def test_mask_to_torch_mha_refuses_what_torch_would(torch, mask, kwargs, match):
    with pytest.raises(ValueError, match=match):
        tc.mask_to_torch_mha(mask, 2, H, **kwargs)
