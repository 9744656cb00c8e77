"""torch.nn.MultiheadAttention's ``add_bias_kv`` and ``add_zero_attn`` as steps of our data path, on every kernel:
outputs, per-head weights and every gradient (inputs, W_*, b_*, bias_k, bias_v) against torch autograd in float64,
with masks of both of torch's kinds, batch > 1, Lq != Lk and kdim / vdim != E; and the cross-check report."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import require_torch

from mha_numpy import MultiHeadAttention, kernels
from mha_numpy.gradcheck import check_mha
from mha_numpy.interop import crosscheck_torch_mha, from_torch_mha, mask_from_torch_mha, to_torch_mha

E, H, B, LQ, LK = 8, 2, 2, 3, 5
KERNELS = [(name, {}) for name in kernels.KERNELS if name != "chunked"]
KERNELS += [("chunked", dict(block_size=2, num_threads=2)), ("chunked", dict(block_size=4, num_threads=1))]
IDS = [n + "".join(f"-{k[0]}{v}" for k, v in o.items()) for n, o in KERNELS]
EXTRAS = {"bias_kv": dict(add_bias_kv=True), "zero_attn": dict(add_zero_attn=True),
          "both": dict(add_bias_kv=True, add_zero_attn=True)}  # fmt: skip


@pytest.fixture(scope="module")
def torch():
    return require_torch()


def torch_module(torch, extras, cross: bool, seed: int = 0):
    torch.manual_seed(seed)
    kw = dict(kdim=5, vdim=7) if cross else {}
    m = torch.nn.MultiheadAttention(E, H, batch_first=True, dtype=torch.float64, **kw, **extras)
    with torch.no_grad():  # nonzero biases everywhere, so a bias that goes missing shows
        for p in (m.in_proj_bias, m.out_proj.bias):
            p.normal_(0, 0.5)
    return m


def torch_masks(torch, kind: str, rng):
    """(key_padding_mask (B, Lk), attn_mask (Lq, Lk)) in torch's convention, True = ignore."""
    pad = np.zeros((B, LK), bool)
    pad[1, -2:] = True  # the second sequence has two padding keys
    causal = np.triu(np.ones((LQ, LK), bool), k=1 + LK - LQ)
    full_row = causal.copy()
    full_row[0] = True  # the first query may attend to none of the keys: only to the appended ones
    return {
        "none": (None, None),
        "padding": (torch.from_numpy(pad), None),
        "causal + padding": (torch.from_numpy(pad), torch.from_numpy(causal)),
        "a row with no key": (None, torch.from_numpy(full_row)),
        "float": (None, torch.from_numpy(np.where(causal, -1e9, rng.normal(0, 0.3, (LQ, LK))))),
    }[kind]


@pytest.mark.parametrize("kind", ["none", "padding", "causal + padding", "a row with no key", "float"])
@pytest.mark.parametrize("extra", list(EXTRAS))
@pytest.mark.parametrize("impl, options", KERNELS, ids=IDS)
def test_outputs_weights_and_every_gradient_match_torch(torch, impl, options, extra, kind, rng):
    cross = kind in ("padding", "float")
    m = torch_module(torch, EXTRAS[extra], cross)
    ours = from_torch_mha(m)
    ours.kernel = kernels.get_kernel(impl, **options)
    if cross:
        query, key, value = (
            rng.standard_normal((B, LQ, E)),
            rng.standard_normal((B, LK, 5)),
            rng.standard_normal((B, LK, 7)),
        )
    else:
        x = rng.standard_normal((B, LK, E))
        query = key = value = x
    kpm, am = torch_masks(torch, kind, rng)
    if not cross and am is not None:
        am = torch.nn.functional.pad(am, (0, 0, 0, LK - LQ))[:LK]  # self-attention: Lq = Lk, the mask grows rows
    mask = mask_from_torch_mha(kpm, am, num_heads=H)
    out, cache = ours.forward(query, key, value, mask=mask)
    leaves = [torch.from_numpy(a).requires_grad_() for a in ((query,) if not cross else (query, key, value))]
    tq, tk, tv = leaves * 3 if not cross else leaves
    out_t, w_t = m(tq, tk, tv, key_padding_mask=kpm, attn_mask=am, average_attn_weights=False)
    d_out = rng.standard_normal(out.shape)
    named = dict(m.named_parameters())
    g_t = torch.autograd.grad(out_t, leaves + list(named.values()), torch.from_numpy(d_out))
    grads = ours.backward(d_out, cache)
    largest = max(float(np.abs(g).max()) for g in grads.values())
    assert np.abs(out - out_t.detach().numpy()).max() <= 1e-12 * np.abs(out).max()
    assert cache.attn_weights.shape[-1] == LK + (extra == "both") + 1
    assert np.abs(cache.attn_weights - w_t.detach().numpy()).max() <= 1e-13
    d_inputs = (
        [grads["query"] + grads["key"] + grads["value"]] if not cross else [grads[n] for n in ("query", "key", "value")]
    )
    theirs = dict(zip(named, g_t[len(leaves) :]))
    ours_by_torch = {"in_proj_bias": np.concatenate([grads["b_q"], grads["b_k"], grads["b_v"]]),
                     "out_proj.weight": grads["W_o"], "out_proj.bias": grads["b_o"]}  # fmt: skip
    if "bias_k" in theirs:
        ours_by_torch.update({"bias_k": grads["bias_k"].reshape(1, 1, E), "bias_v": grads["bias_v"].reshape(1, 1, E)})
        assert np.abs(grads["bias_k"]).max() > 0 and np.abs(grads["bias_v"]).max() > 0  # really learned
    for name, g in ours_by_torch.items():
        assert np.abs(g - theirs[name].numpy()).max() <= 1e-12 * largest, name
    for ours_g, theirs_g in zip(d_inputs, g_t[: len(leaves)]):
        assert np.abs(ours_g - theirs_g.numpy()).max() <= 1e-12 * largest


@pytest.mark.parametrize("extra", list(EXTRAS))
@pytest.mark.parametrize("impl, options", KERNELS, ids=IDS)
def test_finite_differences_of_every_parameter(impl, options, extra, rng):
    mha = MultiHeadAttention(E, H, kdim=5, vdim=7, rng=1, impl=kernels.get_kernel(impl, **options), **EXTRAS[extra])
    for name, p in mha.params.items():
        if name.startswith("b_"):
            p[...] = rng.normal(0, 0.5, p.shape)
    query, key, value = (
        rng.standard_normal((B, LQ, E)),
        rng.standard_normal((B, LK, 5)),
        rng.standard_normal((B, LK, 7)),
    )
    mask = rng.random((B, 1, LQ, LK)) < 0.6  # rows may be fully masked: the appended keys remain
    report = check_mha(mha, query, key, value, mask=mask)
    assert report.passed and max(r.max_rel_err for r in report.rows if not r.zero_gradient) <= 1e-7, str(report)
    assert all(not report[n].zero_gradient for n in mha.params if n.startswith("bias_"))


@pytest.mark.parametrize("extra", list(EXTRAS))
def test_the_crosscheck_report_and_the_round_trip(torch, extra, rng):
    m = torch_module(torch, EXTRAS[extra], cross=False, seed=3)
    x = rng.standard_normal((B, LK, E))
    pad = torch.from_numpy(np.array([[False] * LK, [False] * (LK - 2) + [True] * 2]))
    for need_weights in (True, False):
        report = crosscheck_torch_mha(m, x, x, x, key_padding_mask=pad, need_weights=need_weights)
        assert report.passed, str(report)
        assert extra.split("_")[0] in report.title or extra == "both"
    back = to_torch_mha(from_torch_mha(m))
    for (name, a), (_, b) in zip(m.named_parameters(), back.named_parameters()):
        assert np.array_equal(a.detach().numpy(), b.detach().numpy()), name
    assert (back.bias_k is not None) == ("bias_kv" in extra or extra == "both") and back.add_zero_attn == (
        extra != "bias_kv"
    )
