"""One module: latent attention (MLA) is ``MultiHeadAttention`` with ``kv_lora_rank``, built by the one builder and
walked by the one flow; options declared once on their steps; the plan's order checked; the exporters refuse what they
cannot express, by the declarations.

MLA here gets what every option of the module gets with no code of its own: recompute, the memory budget, the generic
block, soft-cap, sinks, ALiBi, the learned temperature, window masks, the latent cache and the streaming cache.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import grad_check_self_attention, rel_err, require_torch

from mha_numpy import LatentCache, MultiHeadAttention, MultiHeadLatentAttention, StreamingKVCache, masks, steps
from mha_numpy.models.block import Block

SIZES = dict(embed_dim=8, num_heads=2, kv_lora_rank=4, qk_rope_head_dim=4, qk_nope_head_dim=3, v_head_dim=2)
B, L = 2, 6


def mla(rng_seed=0, **options):
    module = MultiHeadLatentAttention(**SIZES, q_lora_rank=3, bias=True, rng=rng_seed, **options)
    rng = np.random.default_rng(rng_seed + 1)
    for p in module.params.values():  # away from the initial values where a gradient could hide (0, 1)
        p += rng.normal(0, 0.3, p.shape)
    return module


# --------------------------------------------------------------------------- one shell


def test_mla_is_the_one_module_with_no_forward_or_backward_of_its_own():
    assert issubclass(MultiHeadLatentAttention, MultiHeadAttention)
    own = vars(MultiHeadLatentAttention)
    assert not {"forward", "backward", "__call__", "_begin", "_plan", "__repr__", "describe"} & set(own), set(own)
    a = mla()
    b = MultiHeadAttention(8, 2, bias=True, rope_theta=10000.0, q_lora_rank=3, **{k: v for k, v in SIZES.items()
                           if k not in ("embed_dim", "num_heads")}, rng=0)  # fmt: skip
    assert a.config == b.config and list(a.params) == list(b.params)
    assert [type(s).__name__ for s in a.steps] == [type(s).__name__ for s in b.steps]


@pytest.mark.parametrize("options", [dict(), dict(softcap=1.5), dict(sinks=True), dict(alibi=True),
                                     dict(head_temperature=True)], ids=str)  # fmt: skip
def test_mla_takes_the_module_options_and_passes_the_gradient_check(options):
    module, x = mla(**options), np.random.default_rng(2).standard_normal((B, L, 8))
    window = masks.sliding_window_mask(L, L, window=3)
    grad_check_self_attention(module, x, mask=window)  # every parameter and the input, against central differences


def test_mla_recompute_and_the_memory_budget_give_the_default_numbers():
    x = np.random.default_rng(3).standard_normal((B, L, 8))
    mask = masks.causal_mask(L)
    plain = mla()
    out, cache = plain.forward(x, mask=mask)
    d = np.random.default_rng(4).standard_normal(out.shape)
    grads = plain.backward(d, cache)
    for options in (dict(recompute=True), dict(memory_budget=0)):  # a budget of 0: over it, so it recomputes
        other = mla(**options)
        other.params = {n: p.copy() for n, p in plain.params.items()}
        o, c = other.forward(x, mask=mask)
        assert type(c).__name__ == "RecomputeCache", options
        assert rel_err(o, out) <= 1e-13
        g = other.backward(d, c)
        for name in grads:
            assert rel_err(g[name], grads[name]) <= 1e-12, (options, name)


@pytest.mark.parametrize("cache_kind", ["latent", "streaming"])
def test_mla_decodes_with_the_latent_and_the_streaming_cache(cache_kind):
    """Token by token: the latent cache equals the full causal forward; the streaming cache (sinks 1, window 3)
    equals, at each step, the last row of a full causal forward over the tokens it kept and the new one (its rule:
    positions are the places in the cache)."""
    module, x = mla(), np.random.default_rng(5).standard_normal((1, L, 8))
    full, _ = module.forward(x, mask=masks.causal_mask(L))
    cache = LatentCache() if cache_kind == "latent" else StreamingKVCache(sink_tokens=1, window=3)
    for t in range(L):
        kept = [] if cache_kind == "latent" else list(cache.kept)
        out, _ = module.forward(x[:, t : t + 1], kv_cache=cache)
        if cache_kind == "latent":
            expected = full[:, t]
        else:
            seen = x[:, kept + [t]]  # (1, n, E): the kept tokens and the new one, at places 0 ... n - 1
            expected = module.forward(seen, mask=masks.causal_mask(seen.shape[1]))[0][:, -1]
        assert rel_err(out[:, 0], expected) <= 1e-12, t
    if cache_kind == "streaming":
        assert len(cache) <= 3


def test_mla_in_the_generic_block():
    """A pre-norm RMSNorm SwiGLU block around MLA (as DeepSeek's layers are): the whole block's gradients against
    central differences, the block's parameters named by a table of roles like any other attention's."""
    from helpers import grad_check

    module = mla()
    rng = np.random.default_rng(6)
    names = {role: f"attn.{role}" for role in module.params}
    names.update({"norm1.weight": "n1", "norm2.weight": "n2", "W_gate": "g", "W_up": "u", "W_down": "dn"})
    params = {f"attn.{role}": p for role, p in module.params.items()}
    params.update(n1=rng.normal(1, 0.2, 8), n2=rng.normal(1, 0.2, 8), g=rng.normal(0, 0.3, (5, 8)),
                  u=rng.normal(0, 0.3, (5, 8)), dn=rng.normal(0, 0.3, (8, 5)))  # fmt: skip
    block = Block(module, params, names, norm_position="pre", norm="rms_norm", eps=1e-6, ffn="swiglu")
    mask = masks.causal_mask(L)

    def forward(x, **ps):
        params.update(ps)
        return block.forward(x, mask=mask)

    def backward(d, cache):
        d_x, g = block.backward(d, cache)
        return d_x, g["attn.W_kvb"], g["g"]

    x = rng.standard_normal((B, L, 8))
    grad_check(forward, backward, {"x": x, "attn.W_kvb": params["attn.W_kvb"], "g": params["g"]},
               ["x", "attn.W_kvb", "g"])  # fmt: skip


def test_options_that_do_not_fit_latent_attention_are_refused_naming_both():
    for option, value in [("qk_norm", True), ("add_bias_kv", True), ("add_zero_attn", True), ("num_kv_heads", 1),
                          ("diff_attention", True), ("head_dim", 4)]:  # fmt: skip
        with pytest.raises(ValueError, match=rf"{option}.*kv_lora_rank|kv_lora_rank.*{option}"):
            mla(**{option: value})
    with pytest.raises(ValueError, match="value must be omitted"):
        m = mla()
        x = np.zeros((1, 2, 8))
        m.forward(x, x, np.ones((1, 2, 8)))
    with pytest.raises(ValueError, match="qk_rope_head_dim is an option of latent attention"):
        MultiHeadAttention(8, 2, qk_rope_head_dim=2)


# --------------------------------------------------------------------------- options declared once


def test_each_option_is_declared_once_on_a_step():
    assert steps.Option in {type(o) for o in steps.OPTIONS.values()}
    owners = {}
    for cls in steps.Step.__subclasses__() + [c for s in steps.Step.__subclasses__() for c in s.__subclasses__()]:
        for name in vars(cls).get("options", {}):
            owners.setdefault(name, []).append(cls.__name__)
    assert all(len(v) == 1 for v in owners.values()), owners
    assert set(owners) == set(steps.OPTIONS)
    with pytest.raises(TypeError, match="declared already"):

        class Twice(steps.Step):  # noqa: F841
            options = {"softcap": steps.Option(None)}


def test_the_review_bugs_eps_none_and_repr_with_head_dim():
    with pytest.raises(ValueError, match="qk_norm_eps"):
        MultiHeadAttention(8, 2, qk_norm=True, qk_norm_eps=None)
    with pytest.raises(ValueError, match="diff_norm_eps"):
        MultiHeadAttention(8, 2, diff_attention=True, diff_norm_eps=None)
    with pytest.raises(ValueError, match="rope_theta"):
        MultiHeadAttention(8, 2, rope_theta=float("inf"))
    m = MultiHeadAttention(10, 4, head_dim=4)
    assert repr(m) == "MultiHeadAttention(embed_dim=10, num_heads=4, bias=True, kdim=10, vdim=10, dropout=0.0, " \
                      "dtype=float64, head_dim=4)"  # fmt: skip
    assert "num_kv_heads" not in repr(MultiHeadAttention(8, 2, num_kv_heads=2))  # = H: not in effect


def test_the_torch_export_refuses_every_option_it_cannot_express_and_exports_the_rest():
    require_torch()
    from mha_numpy.interop import to_torch_mha

    for opt in steps.OPTIONS.values():
        if not opt.example:
            continue
        module = MultiHeadAttention(8, 4, rng=0, **opt.example)
        if all("torch_mha" in steps.OPTIONS[k].exports for k in opt.example):
            to_torch_mha(module)  # an option torch MHA has: exported
        else:
            with pytest.raises(ValueError, match="torch.nn.MultiheadAttention has no"):
                to_torch_mha(module)
    with pytest.raises(ValueError, match="has no head_dim=4"):
        to_torch_mha(MultiHeadAttention(10, 4, head_dim=4))


# --------------------------------------------------------------------------- the plan's contract


def test_a_step_placed_before_what_it_reads_breaks_the_plan(monkeypatch):
    config = steps.AttentionConfig(8, 2, rope_theta=10.0)
    assert [type(s).__name__ for s in steps.build_steps(config)][:3] == ["Project", "Split", "Rope"]
    monkeypatch.setattr(steps.Rope, "place", 15)  # between the projection and the head split
    with pytest.raises(steps.PlanError, match="Rope reads Q, K, which no step before it writes"):
        steps.build_steps(config)
    monkeypatch.setattr(steps.Rope, "place", 40)
    monkeypatch.setattr(steps.Merge, "place", 79)  # before the kernel
    with pytest.raises(steps.PlanError, match="Merge reads context"):
        steps.build_steps(config)


def test_every_declared_read_and_write_is_a_flow_tensor():
    from mha_numpy.flow import FLOW_FIELDS

    for cls in steps.DATA_PATH:
        assert set(cls.reads) | set(cls.writes) <= set(FLOW_FIELDS), cls
        assert cls.writes, cls  # a step that writes nothing does nothing
