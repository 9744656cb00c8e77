"""``mha_numpy.flex``: torch's FlexAttention on NumPy arrays, with its backward.

The score_mod and mask_mod lists of PyTorch's own ``test/inductor/test_flex_attention.py`` at commit
00125ef3dad64a9f8dd8768e81326a34ed7ba91d (``TORCH_COMMIT``: test_score_mods, test_score_mask_mod_map with its
noop_mask, _causal_mask and _inverse_causal_mask, _trig, _trig2, the captured ``head_offset`` buffer, test_Hq_Hkv,
test_Bq_Bkv; ``test_every_entry_of_torchs_lists_is_here`` keeps the list whole), each written
once for both libraries (``xp`` = numpy or torch), plus a learned per-query multiplier and a batch-dependent mask:
the output and lse against torch 2.13's eager ``flex_attention`` on the CPU in float64, and every gradient (query,
key, value, each learned parameter) against torch autograd of a dense float64 reference (torch's flex_attention
refuses a backward on the CPU: ``test_torch_refuses_the_backward_on_the_cpu`` keeps that claim honest), to 1e-10,
on the vectorized kernel and the chunked one (3 x 3 tiles, 2 threads). The derived derivative (complex steps) is
checked against central differences too, and its probe refuses what it cannot see through (np.abs, ``.real``).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from helpers import grad_check, rel_err, require_torch

from mha_numpy import flex, kernels

B, H, LQ, LK, D = 2, 4, 7, 9, 5
TOL = 1e-10


def KERNELS():
    return {"vectorized": "vectorized", "chunked": kernels.ChunkedKernel(block_size=3, num_threads=2)}


# --------- torch's score mods, each written once for numpy and torch (xp) ---------
def identity(xp):
    return lambda score, b, h, m, n: score


def times_two(xp):
    return lambda score, b, h, m, n: score * 2  # plain operators: the same function runs on both


def squared(xp):
    return lambda score, b, h, m, n: score * score


def causal(xp):
    return lambda score, b, h, m, n: xp.where(m >= n, score, float("-inf"))


def inverse_causal(xp):
    return lambda score, b, h, m, n: xp.where(m <= n, score, float("-inf"))


def rel_bias(xp):
    return lambda score, b, h, m, n: score + (m - n)


def rel_causal(xp):
    return lambda score, b, h, m, n: xp.where(m >= n, score + (m - n), float("-inf"))


def alibi(xp, num_heads=8):
    return lambda score, b, h, m, n: score + (n - m) * xp.exp2(-((h + 1) * 8.0 / num_heads))


def trig(xp):
    return lambda score, b, h, m, n: xp.sin(xp.cos(score)) + xp.tan(b)


def trig2(xp):
    return lambda score, b, h, m, n: xp.cos(score) * xp.sin(score) + xp.tan(b)


def head_offset(xp):  # torch's captured buffer, here a learned parameter passed by name
    return lambda score, b, h, m, n, *, head_offset: score * head_offset[h]


def q_multiplier(xp):  # score * multiplier[q_idx]: one of the mods the issue found this library could not express
    return lambda score, b, h, m, n, *, multiplier: score * multiplier[m] + xp.tanh(score) * multiplier[n % 3]


def clipped(xp):  # not torch's: a piecewise mod (np.clip keeps the complex step's imaginary part where it passes s)
    return lambda score, b, h, m, n: xp.clip(score, -0.5, 0.5) + 0.5 * score


def noop(xp):  # torch's noop_mask (batch.new_ones(...)) does not run on NumPy arrays: ours there
    if xp is np:
        from mha_numpy.block_mask import noop_mask

        return noop_mask
    from torch.nn.attention.flex_attention import noop_mask

    return noop_mask


def causal_mask(xp):
    return lambda b, h, m, n: m >= n


def inverse_causal_mask(xp):
    return lambda b, h, m, n: m <= n


MODS = {  # name: (score_mod, mask_mod or None, {param: shape}); torch's test_score_mask_mod_map's pairs first
    "identity": (identity, noop, {}),
    "times_two": (times_two, noop, {}),
    "squared": (squared, noop, {}),
    "causal": (causal, causal_mask, {}),
    "inverse_causal": (inverse_causal, inverse_causal_mask, {}),
    "rel_bias": (rel_bias, noop, {}),
    "rel_causal": (rel_causal, causal_mask, {}),
    "alibi": (alibi, noop, {}),
    "trig": (trig, None, {}),
    "trig2": (trig2, None, {}),
    "head_offset": (head_offset, None, {"head_offset": (H,)}),
    "q_multiplier": (q_multiplier, causal_mask, {"multiplier": (LQ,)}),
    "clipped": (clipped, None, {}),
}


TORCH_COMMIT = "00125ef3dad64a9f8dd8768e81326a34ed7ba91d"  # pytorch/pytorch, test/inductor/test_flex_attention.py
TORCH_SCORE_MASK_MOD_MAP = {  # its test_score_mask_mod_map (whose keys are its test_score_mods), read at TORCH_COMMIT
    "identity": "noop", "times_two": "noop", "squared": "noop", "causal": "causal_mask",
    "inverse_causal": "inverse_causal_mask", "rel_bias": "noop", "rel_causal": "causal_mask", "alibi": "noop",
}  # fmt: skip
TORCH_OTHER_MODS = ("trig", "trig2", "head_offset")  # its _trig, _trig2 and captured_buffers_map's _head_offset


def test_every_entry_of_torchs_lists_is_here():
    """Every score_mod of torch's lists at TORCH_COMMIT is in MODS, paired with the mask_mod torch pairs it with (so
    each runs against torch's forward and autograd in the test below)."""
    for name, mask in TORCH_SCORE_MASK_MOD_MAP.items():
        assert name in MODS and MODS[name][1] is not None and MODS[name][1].__name__ == mask, name
    assert set(TORCH_OTHER_MODS) <= set(MODS)


def inputs(seed=0, b=B, hq=H, hkv=H, bkv=None):
    rng = np.random.default_rng(seed)
    bkv = b if bkv is None else bkv
    return rng.normal(size=(b, hq, LQ, D)), rng.normal(size=(bkv, hkv, LK, D)), rng.normal(size=(bkv, hkv, LK, D))


def make_params(shapes, seed=1):
    rng = np.random.default_rng(seed)
    return {name: rng.uniform(0.5, 1.5, shape) for name, shape in shapes.items()}


def torch_flex(q, k, v, score_mod, mask_mod, params, enable_gqa=False):
    """torch 2.13's eager flex_attention on the CPU in float64 -> (out, lse) as NumPy."""
    torch = require_torch()
    from torch.nn.attention.flex_attention import AuxRequest, create_block_mask, flex_attention

    t = {n: torch.tensor(p) for n, p in params.items()}
    mod = None if score_mod is None else (lambda s, b, h, m, n: score_mod(s, b, h, m, n, **t))
    block = None if mask_mod is None else create_block_mask(mask_mod, q.shape[0], q.shape[1], LQ, LK, device="cpu")
    default = torch.get_default_dtype()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "called without torch.compile()": eager is the reference wanted
        torch.set_default_dtype(torch.float64)  # torch.tan(b) of an int b: float64, not float32
        try:
            out, aux = flex_attention(*map(torch.tensor, (q, k, v)), mod, block, enable_gqa=enable_gqa,
                                      return_aux=AuxRequest(lse=True))  # fmt: skip
        finally:
            torch.set_default_dtype(default)
    return out.numpy(), aux.lse.numpy()


def torch_dense_grads(q, k, v, score_mod, mask_mod, params, d_out):
    """softmax(mod(q kᵀ / √d) masked) v written out in torch float64, differentiated by autograd -> dq, dk, dv,
    {param: gradient}. Key heads repeated over their group, a key of batch 1 broadcast (torch's GQA)."""
    torch = require_torch()
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # as in torch_flex
    try:
        return _dense_grads(torch, q, k, v, score_mod, mask_mod, params, d_out)
    finally:
        torch.set_default_dtype(default)


def _dense_grads(torch, q, k, v, score_mod, mask_mod, params, d_out):
    tq, tk, tv = (torch.tensor(x, requires_grad=True) for x in (q, k, v))
    tp = {n: torch.tensor(p, requires_grad=True) for n, p in params.items()}
    group = q.shape[1] // k.shape[1]
    kk = tk.repeat_interleave(group, dim=1).expand(q.shape[0], -1, -1, -1)  # (B, Hq, Lk, d)
    vv = tv.repeat_interleave(group, dim=1).expand(q.shape[0], -1, -1, -1)
    s = tq @ kk.transpose(-1, -2) / np.sqrt(D)  # (B, Hq, Lq, Lk)
    idx = [torch.arange(n).reshape([-1 if a == i else 1 for a in range(4)]) for i, n in enumerate(s.shape)]
    if score_mod is not None:
        s = score_mod(s, *idx, **tp)
    if mask_mod is not None:
        s = s.masked_fill(~mask_mod(*idx), float("-inf"))
    p = torch.nan_to_num(torch.softmax(s, dim=-1))  # a row with no key: 0
    (p @ vv).backward(torch.tensor(d_out))
    return tq.grad.numpy(), tk.grad.numpy(), tv.grad.numpy(), {n: t.grad.numpy() for n, t in tp.items()}


def check_against_torch(q, k, v, score_mod, mask_mod, params, kernel, enable_gqa=False, score_mod_vjp=None):
    torch = require_torch()
    np_mod = None if score_mod is None else score_mod(np)
    np_mask = None if mask_mod is None else mask_mod(np)
    copies = [x.copy() for x in (q, k, v, *params.values())]
    out, cache = flex.flex_attention_forward(q, k, v, np_mod, None, None, enable_gqa, params, score_mod_vjp, np_mask,
                                             kernel)  # fmt: skip
    t_out, t_lse = torch_flex(q, k, v, None if score_mod is None else score_mod(torch), None if mask_mod is None
                              else mask_mod(torch), params, enable_gqa)  # fmt: skip
    seen = np.isfinite(t_lse)  # -inf: a row with no key, in both
    assert rel_err(out, t_out) <= TOL and np.array_equal(np.isfinite(cache.lse), seen)
    assert rel_err(cache.lse[seen], t_lse[seen]) <= TOL
    d_out = np.random.default_rng(7).normal(size=out.shape)
    dq, dk, dv, d_params = flex.flex_attention_backward(d_out, cache)
    rq, rk, rv, r_params = torch_dense_grads(q, k, v, None if score_mod is None else score_mod(torch),
                                             None if mask_mod is None else mask_mod(torch), params, d_out)  # fmt: skip
    for name, got, want in [("dq", dq, rq), ("dk", dk, rk), ("dv", dv, rv)] + [
        (n, d_params[n], r_params[n]) for n in params
    ]:
        assert got.shape == want.shape and rel_err(got, want) <= TOL, (name, rel_err(got, want))
    assert set(d_params) == set(params)
    assert all(np.array_equal(a, b) for a, b in zip(copies, (q, k, v, *params.values())))  # nothing mutated


@pytest.mark.parametrize("kernel", list(KERNELS()))
@pytest.mark.parametrize("name", list(MODS))
def test_torchs_score_mods_match_its_forward_and_autograd(name, kernel):
    """Each of torch's test score mods (with its paired mask mod) through the derived derivative."""
    score_mod, mask_mod, shapes = MODS[name]
    check_against_torch(*inputs(), score_mod, mask_mod, make_params(shapes), KERNELS()[kernel])


@pytest.mark.parametrize("kernel", list(KERNELS()))
@pytest.mark.parametrize("hkv, bkv", [(2, B), (1, B), (H, 1), (2, 1)])
def test_gqa_and_a_key_batch_of_one_match_torch(hkv, bkv, kernel):
    """torch's test_Hq_Hkv (4, 2), (4, 1) and test_Bq_Bkv (B, 1): a head-dependent mod reads the query's head."""
    q, k, v = inputs(hkv=hkv, bkv=bkv)
    check_against_torch(q, k, v, head_offset, causal_mask, make_params({"head_offset": (H,)}), KERNELS()[kernel],
                        enable_gqa=True)  # fmt: skip


def test_a_mask_that_depends_on_the_batch_with_a_row_that_sees_nothing():
    """kv_idx < length[b] (a padding mask, per batch item) and, in batch 1, a query row 2 blocked everywhere:
    out 0 there as torch's, lse -inf, gradients finite and equal to the dense reference's."""
    torch = require_torch()

    def padding(xp):
        lengths = np.array([LK, 4]) if xp is np else torch.tensor([LK, 4])  # a captured buffer
        return lambda b, h, m, n: (n < lengths[b]) & ~((b == 1) & (m == 2))

    q, k, v = inputs()
    check_against_torch(q, k, v, rel_bias, padding, {}, "vectorized")
    out, cache = flex.flex_attention_forward(q, k, v, mask_mod=padding(np), kernel=KERNELS()["chunked"])
    assert np.all(out[1, :, 2] == 0.0) and np.all(cache.lse[1, :, 2] == -np.inf)


class UserBlockMask:
    """Anything with a ``mask_mod`` and torch's ``seq_lengths`` is taken as a block mask (the BlockMask to come)."""

    def __init__(self, mask_mod, seq_lengths):
        self.mask_mod, self.seq_lengths = mask_mod, seq_lengths


def test_a_block_mask_gives_its_mask_mod_and_its_lengths_are_checked():
    q, k, v = inputs()
    via_block = flex.flex_attention(q, k, v, block_mask=UserBlockMask(causal_mask(np), (LQ, LK)))
    assert np.array_equal(via_block, flex.flex_attention(q, k, v, mask_mod=causal_mask(np)))
    with pytest.raises(ValueError, match=r"block_mask is for \(Q_LEN, KV_LEN\) = \(7, 8\)"):
        flex.flex_attention(q, k, v, block_mask=UserBlockMask(causal_mask(np), (LQ, LK - 1)))
    with pytest.raises(ValueError, match="block_mask must carry its mask_mod"):
        flex.flex_attention(q, k, v, block_mask=np.ones((LQ, LK), dtype=bool))


def test_torchs_own_block_mask_is_taken_when_its_mask_mod_uses_plain_operators():
    torch = require_torch()
    from torch.nn.attention.flex_attention import create_block_mask

    q, k, v = inputs()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        block = create_block_mask(causal_mask(torch), None, None, LQ, LK, device="cpu")
    assert np.array_equal(
        flex.flex_attention(q, k, v, block_mask=block), flex.flex_attention(q, k, v, mask_mod=causal_mask(np))
    )


def soft_cap(score, b, h, m, n, *, cap):
    return cap[h] * np.tanh(score / cap[h])


def soft_cap_vjp(score, b, h, m, n, d_out, *, cap):
    t = np.tanh(score / cap[h])
    d_cap = np.bincount(np.broadcast_to(h, score.shape).ravel(), (d_out * (t - score / cap[h] * (1 - t * t))).ravel(),
                        minlength=cap.size)  # fmt: skip
    return d_out * (1 - t * t), {"cap": d_cap}


def test_the_user_vjp_and_the_derived_one_agree_and_check_by_central_differences():
    """A soft-cap with a learned cap per head, given with its VJP and derived by complex steps: both paths against
    float64 central differences (query, key, value, the cap), and against each other to rounding (the chunked
    kernel's gradients are checked against torch's above; central differences through it would take long)."""
    q, k, v = (x * 3 for x in inputs(b=1, hq=2, hkv=2))  # scores past the cap
    kern = "vectorized"
    cap = np.array([1.0, 3.0])
    grads = []
    for vjp in (soft_cap_vjp, None):

        def forward(query, key, value, cap, vjp=vjp):
            return flex.flex_attention_forward(query, key, value, soft_cap, params={"cap": cap}, score_mod_vjp=vjp,
                                               mask_mod=causal_mask(np), kernel=kern)  # fmt: skip

        def backward(d_out, cache):
            dq, dk, dv, d_params = flex.flex_attention_backward(d_out, cache)
            return dq, dk, dv, d_params["cap"]

        grad_check(forward, backward, dict(query=q, key=k, value=v, cap=cap), ["query", "key", "value", "cap"])
        out, cache = forward(q, k, v, cap)
        grads.append(backward(np.ones_like(out), cache))
    for mine, derived in zip(*grads):
        assert rel_err(derived, mine) <= 1e-13


def test_the_lse_gradient_reaches_query_and_key():
    """d_lse (the gradient of each row's log-sum-exp) joins the backward: checked by central differences."""
    q, k, v = inputs(b=1, hq=2, hkv=2)
    w = np.random.default_rng(3).normal(size=(1, 2, LQ))

    def forward(query, key, value):
        out, cache = flex.flex_attention_forward(query, key, value, trig(np))
        return np.concatenate([out, (cache.lse * w)[..., None]], axis=-1), cache

    def backward(d, cache):
        return flex.flex_attention_backward(d[..., :-1], cache, d_lse=d[..., -1] * w)[:3]

    grad_check(forward, backward, dict(query=q, key=k, value=v), ["query", "key", "value"])


@pytest.mark.parametrize(
    "mod, match",
    [
        (lambda s, b, h, m, n: np.abs(s), r"derivative in the score cannot be derived.*give score_mod_vjp"),
        (lambda s, b, h, m, n: s + np.abs(s - 0.1), r"derivative in the score"),
        (lambda s, b, h, m, n: s.real * 2, r"derivative in the score"),
        (lambda s, b, h, m, n, *, w: s * np.abs(w[h]), r"derivative in params\['w'\]"),
        (lambda s, b, h, m, n: np.floor(s * 4) + s, r"give score_mod_vjp"),
    ],
    ids=["abs", "abs inside", "real", "abs of a parameter", "floor"],
)
def test_the_probe_refuses_what_the_complex_step_cannot_see(mod, match):
    q, k, v = inputs()
    params = {"w": np.array([-1.0, 2.0, -3.0, 0.5])} if "w" in mod.__code__.co_varnames else None
    with pytest.raises(ValueError, match=match):
        flex.flex_attention_forward(q, k, v, mod, params=params)
    out, cache = flex.flex_attention_forward(q, k, v, mod, params=params, score_mod_vjp=lambda *a, **kw: (a[5], {}))
    assert out.shape == (B, H, LQ, D)  # with a VJP given, the mod runs (its derivative is the user's word)
    flex.flex_attention(q, k, v, mod, params=params)  # forward only: no derivative asked for, none probed


def test_a_parameter_too_large_for_complex_steps_asks_for_the_vjp():
    q, k, v = inputs()
    with pytest.raises(ValueError, match=r"params\['table'\] has 4097 > 4096 elements: give score_mod_vjp"):
        flex.flex_attention_forward(q, k, v, lambda s, b, h, m, n, *, table: s + table[0],
                                    params={"table": np.ones(4097)})  # fmt: skip


def test_float32_stays_float32_and_plain_torch_mods_run_unchanged():
    """``score + (q_idx - kv_idx)`` with int64 indices would make float32 scores float64 in NumPy: cast back."""
    q, k, v = (x.astype(np.float32) for x in inputs())
    out, cache = flex.flex_attention_forward(q, k, v, rel_bias(None), params={}, kernel=KERNELS()["chunked"])
    dq, dk, dv, _ = flex.flex_attention_backward(np.ones_like(out), cache)
    assert out.dtype == dq.dtype == dk.dtype == dv.dtype == np.float32
    want = flex.flex_attention(*(x.astype(np.float64) for x in (q, k, v)), rel_bias(None))
    assert rel_err(out, want) <= 1e-5


def test_torchs_return_forms():
    q, k, v = inputs()
    out = flex.flex_attention(q, k, v, causal(np))
    out2, lse = flex.flex_attention(q, k, v, causal(np), return_lse=True)
    out3, aux = flex.flex_attention(q, k, v, causal(np), return_aux=flex.AuxRequest(lse=True))
    assert np.array_equal(out, out2) and np.array_equal(out, out3) and np.array_equal(lse, aux.lse)
    assert aux.max_scores is None and lse.shape == (B, H, LQ)
    with pytest.raises(ValueError, match="return_lse or return_aux"):
        flex.flex_attention(q, k, v, return_lse=True, return_aux=flex.AuxRequest(lse=True))


def test_torch_refuses_the_backward_on_the_cpu():
    """The reason the gradients are checked against a dense autograd reference: if torch starts to differentiate
    flex_attention on the CPU, this fails, and the tests should compare against it directly."""
    torch = require_torch()
    from torch.nn.attention.flex_attention import flex_attention

    q, k, v = (torch.tensor(x, requires_grad=True) for x in inputs())
    with warnings.catch_warnings(), pytest.raises(NotImplementedError, match="backward on CPU"):
        warnings.simplefilter("ignore")
        flex_attention(q, k, v)


def _raises(s, b, h, m, n):
    raise KeyError("boom")


BAD = {  # what: (call arguments, the message)
    "a mod of the wrong shape": (dict(score_mod=lambda s, b, h, m, n: s[..., None] * np.ones(2)), r"returned shape"),
    "a mod returning bool": (dict(score_mod=lambda s, b, h, m, n: s > 0), r"score_mod must return float scores"),
    "a mod returning ints": (dict(score_mod=lambda s, b, h, m, n: (m - n) * np.ones_like(s, dtype=int)), r"float"),
    "a mod that raises": (dict(score_mod=_raises), r"score_mod raised KeyError: 'boom'"),
    "a mask_mod of floats": (dict(mask_mod=lambda b, h, m, n: (m >= n) * 1.0), r"mask_mod must return a bool"),
    "a mask_mod of the wrong shape": (dict(mask_mod=lambda b, h, m, n: np.ones((3, 1, 1), bool)), r"mask_mod returned"),
    "a mask_mod that raises": (dict(mask_mod=lambda b, h, m, n: n.nope), r"mask_mod raised AttributeError"),
    "params of lists": (dict(score_mod=head_offset(np), params={"head_offset": [1.0] * H}), r"params\['head_offset'\]"),
    "params of ints": (dict(score_mod=head_offset(np), params={"head_offset": np.ones(H, int)}), r"params\['head_"),
    "params without a mod": (dict(params={"w": np.ones(3)}), r"params are given but no score_mod"),
    "a mod writing into its score": (dict(score_mod=lambda s, b, h, m, n: s.__imul__(2)), r"score_mod raised"),
    "a vjp of the wrong shape": (
        dict(score_mod=times_two(np), score_mod_vjp=lambda s, b, h, m, n, d: (d[:1], {})),
        r"score_mod_vjp returned d_score of shape",
    ),  # fmt: skip
    "GQA not asked for": (dict(key="half heads"), r"give enable_gqa=True"),
    "an unknown kernel": (dict(kernel="nope"), r"kernel must be a registered name"),
}


@pytest.mark.parametrize("what", list(BAD))
def test_bad_input_is_a_value_error_naming_the_argument_and_nothing_is_mutated(what):
    kw, match = BAD[what]
    q, k, v = inputs()
    if kw.get("key") == "half heads":
        k, v, kw = k[:, :2], v[:, :2], {}
    args = dict(query=q, key=k, value=v, **kw)
    copies = {n: (a.copy() if isinstance(a, np.ndarray) else a) for n, a in args.items()}
    with pytest.raises(ValueError, match=match):
        out, cache = flex.flex_attention_forward(**args)
        flex.flex_attention_backward(np.ones_like(out), cache)
    for n, a in args.items():
        if isinstance(a, np.ndarray):
            assert np.array_equal(a, copies[n]), n


def test_our_block_mask_reaches_the_chunked_kernel_as_its_blocks_not_a_dense_mask():
    """Given our BlockMask, flex hands it to the kernel as it is: the chunked kernel visits its listed blocks (the
    cache keeps the BlockMask, no (L, L) array), with the numbers of the dense mask_mod."""
    from mha_numpy import masks
    from mha_numpy.block_mask import BlockMask, and_masks, create_block_mask

    rng = np.random.default_rng(3)
    L = 96
    q, k, v = (rng.normal(size=(1, 2, L, 4)) for _ in range(3))
    bm = create_block_mask(and_masks(masks.causal_mod, masks.document_mod([40, 56])), None, None, L, L, BLOCK_SIZE=16)
    out, cache = flex.flex_attention_forward(q, k, v, block_mask=bm, kernel="chunked")
    assert isinstance(cache.inner.args.mask, BlockMask)
    dense, dense_cache = flex.flex_attention_forward(q, k, v, mask_mod=bm.mask_mod)
    assert np.abs(out - dense).max() <= 1e-13
    d = rng.normal(size=out.shape)
    for a, b in zip(flex.flex_attention_backward(d, cache)[:3], flex.flex_attention_backward(d, dense_cache)[:3]):
        assert np.abs(a - b).max() <= 1e-12 * np.abs(b).max()


def test_the_mods_get_and_give_read_only_arrays_and_nothing_is_copied_or_mutated():
    """flex hands the mod read-only views and the kernel a read-only view of the mod's result (no copy of a tile):
    a mod writing into its score or a parameter is a ValueError naming score_mod on the chunked kernel too (where no
    probe runs before the tiles); a mod returning an array it holds gets the same numbers as a fresh one, and that
    array, the inputs and the parameters are left as they were."""
    q, k, v = inputs()
    w = np.linspace(0.5, 1.5, H)
    copies = [x.copy() for x in (q, k, v, w)]
    writers = {  # writing into
        "score": lambda s, b, h, m, n, *, w: s.__iadd__(1.0),
        "a parameter": lambda s, b, h, m, n, *, w: s * w.__imul__(2.0)[h],
    }
    for mod in writers.values():
        with pytest.raises(ValueError, match=r"score_mod raised ValueError: .*read-only"):
            flex.flex_attention(q, k, v, mod, params={"w": w}, kernel=KERNELS()["chunked"])
    held = np.zeros((B, H, LQ, LK))  # a mod's own array, returned as the whole block's scores (vectorized kernel)

    def constant(s, b, h, m, n):
        return held if s.shape == held.shape else np.zeros_like(s)  # the probe's entries: (16,)

    out, cache = flex.flex_attention_forward(q, k, v, constant, score_mod_vjp=lambda s, b, h, m, n, d: (0 * s, {}))
    assert not cache.inner.scores.flags.writeable and np.shares_memory(cache.inner.scores, held)  # not copied
    flex.flex_attention_backward(np.ones_like(out), cache)
    assert rel_err(out, np.broadcast_to(v.mean(axis=2, keepdims=True), out.shape)) <= 1e-14 and not held.any()
    assert all(np.array_equal(a, b) for a, b in zip(copies, (q, k, v, w)))
