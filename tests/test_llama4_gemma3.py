"""Llama 4's layers and Gemma 3's (issue 38, items 3 and 4): chunked attention (``masks.chunked_causal_mask``),
the attention temperature of long contexts (``log_length_scale``), the weightless QK-norm (``qk_norm_weight=False``),
NoPE layers, and the importers ``interop.llama4`` and ``interop.gemma3``.

Expected numbers come from transformers (tiny local configs, float64, eager), torch autograd, or central
differences; never from our own output.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from helpers import check_recompute_and_decoding, grad_check_self_attention, require_torch

from mha_numpy import KVCache, MultiHeadAttention, MultiHeadLatentAttention, kernels, masks
from mha_numpy import functional as F

KERNELS = {
    "vectorized": "vectorized",
    "naive": "naive",
    "chunked": kernels.get_kernel("chunked", block_size=2, num_threads=2),
    "auto": "auto",
}


@pytest.fixture
def torch():
    t = require_torch()
    t.set_num_threads(1)
    return t


@pytest.fixture
def transformers(torch):
    return pytest.importorskip(
        "transformers", reason="transformers is not installed: pip install -r requirements-dev.txt"
    )


# --------------------------------------------------------------------------- chunked attention: the mask


def test_the_chunked_mask_equals_transformers_create_chunked_causal_mask(transformers, torch):
    """Left and right padding (the chunks counted from each item's first real token), chunk 3 of 9 positions."""
    from transformers import Llama4TextConfig
    from transformers.masking_utils import create_chunked_causal_mask

    cfg = Llama4TextConfig(hidden_size=8, num_attention_heads=2, num_key_value_heads=1, head_dim=4, vocab_size=8,
                           attention_chunk_size=3, attn_implementation="eager")  # fmt: skip
    am = np.array([[1] * 9, [0, 0] + [1] * 7, [1] * 7 + [0, 0], [0] * 5 + [1] * 4])
    x = torch.zeros(4, 9, 8, dtype=torch.float64)
    theirs = create_chunked_causal_mask(config=cfg, inputs_embeds=x, attention_mask=torch.tensor(am), cache=None)
    theirs = theirs.numpy() == 0  # (4, 1, 9, 9) additive 0 / finfo.min -> allowed
    left = np.array([0, 2, 0, 5])  # transformers' left_padding_tokens: the leading zeros of each row
    pad = masks.padding_mask(attention_mask=am)
    ours = masks.chunked_causal_mask(9, chunk_size=3, left_padding=left, structured=True) & pad
    np.testing.assert_array_equal(np.asarray(ours), theirs)
    np.testing.assert_array_equal(masks.chunked_causal_mask(9, chunk_size=3, left_padding=left) & pad, theirs)
    mod = masks.chunked_causal_mod(3, left)
    b, q, kv = np.arange(4)[:, None, None, None], np.arange(9)[:, None], np.arange(9)[None, :]
    np.testing.assert_array_equal(mod(b, 0, q, kv) & pad, theirs)
    assert theirs[0, 0, 3, :3].sum() == 0 and theirs[1, 0, 4, 2:5].all() and not theirs[1, 0, 5, 4]  # chunks cut


def test_the_chunked_mask_after_a_cache_is_the_bottom_right_rows():
    full = masks.chunked_causal_mask(11, chunk_size=4)
    for Lq in (1, 3):
        part = masks.chunked_causal_mask(Lq, 11, chunk_size=4, align="bottom-right", structured=True)
        np.testing.assert_array_equal(np.asarray(part)[0, 0], full[11 - Lq :])


def test_the_chunked_kernel_skips_the_tiles_outside_the_chunks(rng):
    """L = 48, chunks of 8, tiles of 4: the rule visits the tiles of the chunks' triangles (and the array the same
    ones), far fewer than a causal mask's; the numbers equal the dense mask's on the vectorized kernel."""
    L = 48
    q, k, v = (rng.standard_normal((2, 2, L, 3)) for _ in range(3))
    rule = masks.chunked_causal_mask(L, chunk_size=8, structured=True)
    kern = kernels.ChunkedKernel(block_size=4, num_threads=1)
    ctx, cache = kern.forward(q, k, v, mask=rule)
    ref = kernels.get_kernel("vectorized").forward(q, k, v, mask=np.asarray(rule))[0]
    assert np.abs(ctx - ref).max() <= 1e-14 * np.abs(ref).max()
    work = {key for key, (state, _) in cache.tile_states.items() if state != masks.EMPTY}
    causal = kern.forward(q, k, v, mask=masks.causal_mask(L, structured=True))[1]
    assert len(work) == 6 * 3  # the rule is shared by the batch: 6 chunks of 2 x 2 tiles, 3 on or under the diagonal
    assert len(work) < 0.3 * sum(state != masks.EMPTY for state, _ in causal.tile_states.values())


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(Lq=4, chunk_size=0), "chunk_size must be"),
        (dict(Lq=4, chunk_size=2, left_padding=-1), "left_padding must"),
        (dict(Lq=4, chunk_size=2, left_padding=[1, -2]), "left_padding must hold non-negative ints"),
        (dict(Lq=5, Lk=3, chunk_size=2), "Lq=5 queries at positions 0 ... 4 go past the Lk=3 keys"),
    ],
)
def test_bad_chunked_masks_are_refused_naming_the_argument(kwargs, message):
    with pytest.raises(ValueError, match=message):
        masks.chunked_causal_mask(**kwargs)


# --------------------------------------------------------------------------- the attention temperature, the L2 norm

B, H, HKV, D, L = 2, 4, 2, 4, 7
E = H * D
SCALE, FLOOR = 0.7, 2.0  # positions 0 ... 6: ⌊(p + 1) / 2⌋ = 0, 1, 1, 2, 2, 3, 3 (the first row unchanged)


def gains(positions, attn_scale=SCALE, floor_scale=FLOOR) -> np.ndarray:
    """Llama 4's attn_scales, one position at a time with math.log and math.floor."""
    return np.array([math.log(math.floor((p + 1) / floor_scale) + 1) * attn_scale + 1 for p in positions])


def module(impl="vectorized", **options):
    """A module with nonzero biases (GQA 4 / 2, d = 4) and the options."""
    kernel = KERNELS[impl]
    mha = MultiHeadAttention(E, H, num_kv_heads=HKV, rng=0, impl=kernel, **options)
    rng = np.random.default_rng(1)
    for p in mha.params.values():
        p += rng.normal(0.0, 0.3, p.shape)
    return mha


def rope_by_hand(x, theta=50.0):
    """Llama's rotate_half RoPE of x (B, h, L, d) at positions 0 ... L - 1, written out."""
    d = x.shape[-1]
    angle = np.arange(x.shape[2])[:, None] * theta ** (-np.arange(0, d, 2) / d)  # (L, d/2)
    cos, sin = np.cos(np.concatenate([angle] * 2, -1)), np.sin(np.concatenate([angle] * 2, -1))  # (L, d)
    rotated = np.concatenate([-x[..., d // 2 :], x[..., : d // 2]], axis=-1)
    return x * cos + rotated * sin


def reference(mha, x, mask, temperature=False, l2_after_rope=False, eps=1e-6):
    """The module written out with einsum, Llama 4's way: the query rows times their gain (NoPE layers), or RoPE
    then x / sqrt(mean(x²) + eps) on Q and K (its L2 norm, applied after RoPE)."""
    P = mha.params
    q, k, v = (x @ P[f"W_{n}"].T + P[f"b_{n}"] for n in "qkv")
    Q = q.reshape(B, L, H, D).transpose(0, 2, 1, 3)  # (B, H, L, d)
    K, V = (a.reshape(B, L, HKV, D).transpose(0, 2, 1, 3) for a in (k, v))  # (B, Hkv, L, d)
    if l2_after_rope:
        Q, K = (a / np.sqrt((a * a).mean(-1, keepdims=True) + eps) for a in (rope_by_hand(Q), rope_by_hand(K)))
    if temperature:
        Q = Q * gains(range(L))[:, None]  # row p times g(p)
    K, V = (a.repeat(H // HKV, axis=1) for a in (K, V))  # (B, H, L, d)
    s = np.where(mask, np.einsum("bhid,bhjd->bhij", Q, K) / np.sqrt(D), -np.inf)
    w = np.exp(s - s.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    return np.einsum("bhij,bhjd->bhid", w, V).transpose(0, 2, 1, 3).reshape(B, L, E) @ P["W_o"].T + P["b_o"]


LLAMA4_OPTIONS = {
    "temperature": dict(log_length_scale=SCALE, log_length_floor=FLOOR),  # a NoPE layer's
    "l2_after_rope": dict(rope_theta=50.0, qk_norm=True, qk_norm_weight=False),  # a RoPE layer's
}


@pytest.mark.parametrize("impl", list(KERNELS))
@pytest.mark.parametrize("layer", list(LLAMA4_OPTIONS))
def test_llama4s_temperature_and_l2_norm_are_its_formulas_on_every_kernel(layer, impl, rng):
    mha = module(impl, **LLAMA4_OPTIONS[layer])
    x, mask = rng.standard_normal((B, L, E)), masks.causal_mask(L)
    out, _ = mha.forward(x, x, x, mask=mask)
    ref = reference(mha, x, mask, **{layer: True})
    assert np.abs(out - ref).max() <= 1e-13 * np.abs(ref).max()
    plain = MultiHeadAttention(E, H, num_kv_heads=HKV, rng=0, rope_theta=mha.rope_theta)
    plain.params.update(mha.params)
    assert np.abs(plain.forward(x, x, x, mask=mask)[0] - out).max() > 1e-3 * np.abs(out).max()  # it does something
    assert "q_norm" not in mha.params and "k_norm" not in mha.params  # the L2 norm has no weight


@pytest.mark.parametrize("layer", list(LLAMA4_OPTIONS))
def test_their_gradients_against_central_differences_recompute_and_decoding(layer, rng):
    mha = module(**LLAMA4_OPTIONS[layer])
    x = rng.standard_normal((B, L, E))
    grad_check_self_attention(mha, x, masks.causal_mask(L))
    check_recompute_and_decoding(mha, module(recompute=True, **LLAMA4_OPTIONS[layer]), x, rng)


def test_decoding_counts_the_cached_positions_in_the_temperature(rng):
    """A prefill of 3, then one token a call: queries at 3, 4, ... after the cached positions."""
    mha = module(**LLAMA4_OPTIONS["temperature"])
    x = rng.standard_normal((B, L, E))
    full = mha.forward(x, x, x, mask=masks.causal_mask(L))[0]
    kv = KVCache()
    parts = [mha.forward(x[:, :3], x[:, :3], x[:, :3], kv_cache=kv)[0]]
    parts += [mha.forward(*(x[:, t : t + 1],) * 3, kv_cache=kv)[0] for t in range(3, L)]
    assert np.abs(np.concatenate(parts, axis=1) - full).max() <= 1e-12 * np.abs(full).max()


def test_latent_attention_scales_its_queries_the_same_way(rng):
    """MLA without a query bias or norm: Q is linear in the query, so scaling the query tokens is Llama 4's way."""
    sizes = dict(kv_lora_rank=6, qk_rope_head_dim=2, qk_nope_head_dim=2, v_head_dim=3, rope_theta=30.0, rng=0)
    mla = MultiHeadLatentAttention(E, H, **sizes, log_length_scale=SCALE, log_length_floor=FLOOR)
    plain = MultiHeadLatentAttention(E, H, **sizes)
    plain.params.update(mla.params)
    x, mask = rng.standard_normal((B, L, E)), masks.causal_mask(L)
    out = mla.forward(x, mask=mask)[0]
    ref = plain.forward(x * gains(range(L))[:, None], key=x, mask=mask)[0]
    assert np.abs(out - ref).max() <= 1e-13 * np.abs(ref).max()


def test_the_temperature_pair_at_llama4s_settings():
    """attn_scale 0.1, floor_scale 8192: 1 until position 8190, 1 + 0.1 log 2 from 8191, 1 + 0.1 log 3 from 16383;
    float32 stays float32."""
    positions, offset = np.array([0, 8189, 8190, 8191, 16382, 16383, 100_000]), 5  # offset: cached positions
    score = np.full((1, 1, len(positions), 2), 2.0)  # a block: two keys per query
    q_idx, kv_idx = (positions - offset)[:, None], np.arange(2)[None]
    kw = dict(attn_scale=0.1, floor_scale=8192.0, offset=offset)
    expected = 2.0 * gains(positions, 0.1, 8192)[:, None]
    assert np.abs(F.log_length_scale_score(score, 0, 0, q_idx, kv_idx, **kw) - expected).max() <= 1e-15
    assert list(expected[:3, 0]) == [2.0] * 3 and expected[3, 0] > 2.0
    d_out = np.arange(score.size, dtype=float).reshape(score.shape)
    d_score, d_params = F.log_length_scale_score_vjp(score, 0, 0, q_idx, kv_idx, d_out, **kw)
    assert np.abs(d_score - d_out * expected / 2.0).max() <= 1e-13 and d_params == {}
    assert F.log_length_scale_score(score.astype(np.float32), 0, 0, q_idx, kv_idx, **kw).dtype == np.float32


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(log_length_scale=0.0), "log_length_scale must be a positive finite number or None, got 0.0"),
        (dict(log_length_scale=float("nan")), "log_length_scale must be a positive finite number"),
        (dict(log_length_scale=0.1, log_length_floor=0), "log_length_floor must be a positive finite number, got 0"),
        (dict(qk_norm=True, qk_norm_weight="no"), "qk_norm_weight"),
    ],
)
def test_bad_values_are_refused_naming_the_option(options, message):
    with pytest.raises(ValueError, match=message):
        MultiHeadAttention(E, H, **options)


def test_the_torch_exporter_refuses_them(torch):
    from mha_numpy.interop import to_torch_mha

    with pytest.raises(ValueError, match="log_length_scale=0.1"):
        to_torch_mha(MultiHeadAttention(E, H, log_length_scale=0.1, rng=0))
    with pytest.raises(ValueError, match="qk_norm"):
        to_torch_mha(MultiHeadAttention(E, H, qk_norm=True, qk_norm_weight=False, rng=0))


# --------------------------------------------------------------------------- Llama 4's layers vs Llama4TextAttention

LAYERS4 = {"rope, chunked": 0, "nope, full": 3}  # of 4 layers: 0-2 RoPE with chunked attention, 3 NoPE (the default)
L4 = 8  # chunks of 3: [0, 3), [3, 6), [6, 8); the second item has its last token padded (its chunk keeps one key)
PADDING4 = np.array([[1] * L4, [1] * (L4 - 1) + [0]])


def llama4(layer, dtype=np.float64, **kw):
    from mha_numpy.interop import llama4 as l4

    return l4.hf_llama4_attention(16, 4, 2, 6, layer_idx=LAYERS4[layer], dtype=dtype, **kw)


def x4(seed=1):
    return np.random.default_rng(seed).standard_normal((2, L4, 16))


@pytest.mark.parametrize("kernel", list(KERNELS))
@pytest.mark.parametrize("layer", list(LAYERS4))
def test_llama4_layers_match_transformers_on_every_kernel(transformers, layer, kernel):
    from mha_numpy.interop import crosscheck_hf_llama4_attention

    report = crosscheck_hf_llama4_attention(llama4(layer), x4(), attention_mask=PADDING4, kernel=KERNELS[kernel])
    assert report.passed and report.rtol == 1e-10, str(report)
    params = ["W_q", "W_k", "W_v", "W_o", "b_q", "b_k", "b_v", "b_o"]
    assert [r.name for r in report.rows] == ["mask (allowed keys)", "output", "attention weights", "Q (as attended)",
                                             "K (as attended)", "V (as attended)", "dL/dx (q+k+v paths)",
                                             *(f"dL/d{p}" for p in params)]  # fmt: skip
    assert not any(r.zero for r in report.rows[1:] if r.name != "dL/db_k")  # b_k's: 0 in theory (softmax shift)
    assert report["mask (allowed keys)"].max_abs_err == 0


@pytest.mark.parametrize("layer", list(LAYERS4))
def test_llama4_float32_recompute_positions_and_the_layers_options(transformers, layer):
    from mha_numpy.interop import crosscheck_hf_llama4_attention, from_hf_llama4_attention

    report = crosscheck_hf_llama4_attention(llama4(layer, np.float32), x4(2), attention_mask=PADDING4)
    assert report.passed and report.rtol == 1e-5, str(report)
    chunked = KERNELS["chunked"]
    report = crosscheck_hf_llama4_attention(llama4(layer), x4(3), PADDING4, kernel=chunked, recompute=True)
    assert report.passed, str(report)
    positions = np.array([[0, 1, 2, 3, 4, 5, 6, 7], [40, 41, 42, 43, 300, 301, 302, 303]])
    assert crosscheck_hf_llama4_attention(llama4(layer, seed=4), x4(4), positions=positions).passed
    mha, rope = from_hf_llama4_attention(llama4(layer)), layer.startswith("rope")
    assert (mha.rope_theta == 100.0, mha.qk_norm, mha.log_length_scale) == (rope, rope, None if rope else 0.7)
    assert ("Rope" in mha.describe()) == rope and "q_norm" not in mha.params


LLAMA3 = {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 16}  # fmt: skip  # wavelengths 6, 29, 136: every branch of llama3's


def test_llama4_rope_layers_turn_interleaved_pairs_by_its_llama3_scaled_table(transformers, monkeypatch):
    """Llama 4's RoPE (its complex form: pairs (2i, 2i + 1)) with its own rope_type "llama3"; the other layout, or
    the table without the scaling, fails the check."""
    from mha_numpy.interop import crosscheck_hf_llama4_attention, crosscheck_hf_llama4_kv_cache
    from mha_numpy.interop import llama4 as l4

    module = llama4("rope, chunked", rope_scaling=LLAMA3)
    assert crosscheck_hf_llama4_attention(module, x4(11), PADDING4, kernel=KERNELS["chunked"]).passed
    assert crosscheck_hf_llama4_kv_cache(module, x4(11), PADDING4, chunk=2).passed
    options = l4.llama4_layer_options
    for change in ({"rope_interleave": False}, {"rope_scaling": None}):
        monkeypatch.setattr(l4, "llama4_layer_options", lambda cfg, i, change=change: {**options(cfg, i), **change})
        assert not crosscheck_hf_llama4_attention(module, x4(11), PADDING4).passed, change


@pytest.mark.parametrize("chunk", [1, 2])
@pytest.mark.parametrize("kernel", ["vectorized", "chunked"])
@pytest.mark.parametrize("layer", list(LAYERS4))
def test_llama4_decoding_matches_transformers_cache(transformers, layer, kernel, chunk):
    """Prefill 3 then `chunk` a call: the chunked layer's keys cut at the chunks, the temperature counts the cache."""
    from mha_numpy.interop import crosscheck_hf_llama4_kv_cache

    report = crosscheck_hf_llama4_kv_cache(llama4(layer), x4(5), PADDING4, chunk=chunk, kernel=KERNELS[kernel])
    assert report.passed, str(report)


def test_llama4_without_its_options_and_bad_layers(transformers):
    """use_qk_norm and attn_temperature_tuning off: plain RoPE and plain NoPE layers; a layer index outside the
    config, an unknown layer type: ValueError naming them."""
    from mha_numpy.interop import crosscheck_hf_llama4_attention, llama4_layer_mask, llama4_layer_options

    for layer in LAYERS4:
        module = llama4(layer, use_qk_norm=False, attn_temperature_tuning=False, bias=False)
        assert crosscheck_hf_llama4_attention(module, x4(6), PADDING4).passed
    cfg = llama4("nope, full").config
    assert llama4_layer_options(cfg, 3) == {"rope_theta": None, "log_length_scale": 0.7, "log_length_floor": 2.0}
    with pytest.raises(ValueError, match=r"layer_idx must be an int in \[0, 4\)"):
        llama4_layer_options(cfg, 4)
    cfg.layer_types = ["chunked_attention", "sliding_attention", "full_attention", "full_attention"]
    with pytest.raises(ValueError, match=r"config.layer_types\[1\] must be one of"):
        llama4_layer_mask(cfg, 1, 4)


# --------------------------------------------------------------------------- Gemma 3's local and global layers

GEMMA3_LAYERS = ("sliding_attention", "full_attention")  # layer 0 (window 3, base 10), layer 1 (base 1000)
PADDING3 = np.array([[1] * L, [1] * (L - 2) + [0] * 2])


def gemma3(layer, dtype=np.float64, **kw):
    from mha_numpy.interop import hf_gemma3_attention

    return hf_gemma3_attention(16, 4, 2, 6, layer=layer, dtype=dtype, **kw)


@pytest.mark.parametrize("kernel", list(KERNELS))
@pytest.mark.parametrize("layer", GEMMA3_LAYERS)
def test_gemma3_layers_match_transformers_on_every_kernel(transformers, layer, kernel):
    from mha_numpy.interop import crosscheck_hf_gemma3_attention

    report = crosscheck_hf_gemma3_attention(gemma3(layer), x4(7)[:, :L], PADDING3, kernel=KERNELS[kernel])
    assert report.passed and report.rtol == 1e-10, str(report)
    assert [r.name for r in report.rows][-2:] == ["dL/dq_norm", "dL/dk_norm"] and len(report.rows) == 17
    assert not any(r.zero for r in report.rows[1:]) and report["mask (allowed keys)"].max_abs_err == 0


@pytest.mark.parametrize("layer", GEMMA3_LAYERS)
def test_gemma3_float32_recompute_decoding_and_its_two_rope_bases(transformers, layer, monkeypatch):
    """Each layer type turns by its own base (10 local, 1000 global); the other's base fails the check."""
    from mha_numpy.interop import crosscheck_hf_gemma3_attention, crosscheck_hf_gemma3_kv_cache
    from mha_numpy.interop import gemma3 as g3

    x = x4(8)[:, :L]
    assert crosscheck_hf_gemma3_attention(gemma3(layer, np.float32), x, PADDING3).passed
    assert crosscheck_hf_gemma3_attention(gemma3(layer), x, PADDING3, kernel=KERNELS["chunked"], recompute=True).passed
    report = crosscheck_hf_gemma3_kv_cache(gemma3(layer), x, PADDING3, chunk=2, kernel=KERNELS["chunked"])
    assert report.passed, str(report)
    assert g3.from_hf_gemma3_attention(gemma3(layer)).rope_theta == {"sliding_attention": 10.0}.get(layer, 1000.0)
    other = 1000.0 if layer == "sliding_attention" else 10.0
    monkeypatch.setattr(g3, "gemma3_layer_options", lambda cfg, i: {"rope_theta": other})
    assert not crosscheck_hf_gemma3_attention(gemma3(layer), x, PADDING3).passed


def test_gemma3_unknown_layer_types_and_a_rope_without_its_base_are_refused(transformers):
    from mha_numpy.interop import gemma3_layer_options

    cfg = gemma3("full_attention").config
    assert [gemma3_layer_options(cfg, i)["rope_theta"] for i in (0, 1)] == [10.0, 1000.0]
    with pytest.raises(ValueError, match=r"layer_idx must be an int in \[0, 2\)"):
        gemma3_layer_options(cfg, 2)
    cfg.layer_types = ["sliding_attention", "chunked_attention"]
    with pytest.raises(ValueError, match=r"config.layer_types\[1\] must be one of"):
        gemma3_layer_options(cfg, 1)
    cfg.rope_parameters["sliding_attention"] = {"rope_type": "linear", "factor": 8.0}
    with pytest.raises(ValueError, match=r"config.rope_parameters\['sliding_attention'\] must hold the layer type's"):
        gemma3_layer_options(cfg, 0)


def test_gemma3_global_layers_with_their_linear_scaling(transformers, monkeypatch):
    """Gemma 3's global layers (4B and up) divide their positions by 8: "linear", imported from the layer type's
    rope_parameters; HF's (cos, sin) come from its own rotary module, so the table without the scaling fails."""
    from mha_numpy.interop import crosscheck_hf_gemma3_attention, crosscheck_hf_gemma3_kv_cache
    from mha_numpy.interop import gemma3 as g3

    module = gemma3("full_attention", rope_scaling={"rope_type": "linear", "factor": 8.0})
    assert g3.gemma3_layer_options(module.config, 1)["rope_scaling"] == {"rope_type": "linear", "factor": 8.0}
    x = x4(12)[:, :L]
    assert crosscheck_hf_gemma3_attention(module, x, PADDING3, kernel=KERNELS["chunked"]).passed
    assert crosscheck_hf_gemma3_kv_cache(module, x, PADDING3, chunk=2).passed
    monkeypatch.setattr(g3, "gemma3_layer_options", lambda cfg, i: {"rope_theta": 1000.0})
    assert not crosscheck_hf_gemma3_attention(module, x, PADDING3).passed


# ------------------------------------------------------------------- Gemma 3n: v_norm and cross-layer KV sharing


def gemma3n(dtype=np.float64, **kw):
    from mha_numpy.interop import gemma3n as g3n

    return g3n.hf_gemma3n_layers(16, 4, 2, 6, dtype=dtype, **kw)  # layers 0-3: sliding, full, sliding, full


def xs3n(seed=9):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((2, L, 16)) for _ in range(4)]


@pytest.mark.parametrize("kernel", list(KERNELS))
def test_gemma3n_kv_sharing_matches_transformers_on_every_kernel(transformers, kernel):
    """Layers 2 and 3 read the K and V of layers 0 and 1 (their types' last): every output, every input's gradient
    and every parameter's, layers 0 and 1's including what their readers send back."""
    from mha_numpy.interop import gemma3n as g3n

    report = g3n.crosscheck_hf_gemma3n_layers(gemma3n(), xs3n(), PADDING3, kernel=KERNELS[kernel])
    assert report.passed and report.rtol == 1e-10, str(report)
    assert len(report.rows) == 4 * 2 + 2 * 10 + 2 * 5 and not any(r.zero for r in report.rows if "b_o" not in r.name)
    assert report.title.endswith("sources [0, 1, 0, 1]")


def test_gemma3n_float32_and_a_source_without_its_readers_gradients_fails(transformers, monkeypatch):
    from mha_numpy.interop import gemma3n as g3n

    assert g3n.crosscheck_hf_gemma3n_layers(gemma3n(np.float32), xs3n(10), PADDING3).passed
    real = MultiHeadAttention.backward
    monkeypatch.setattr(MultiHeadAttention, "backward", lambda self, d, c, d_shared_kv=None: real(self, d, c))
    report = g3n.crosscheck_hf_gemma3n_layers(gemma3n(), xs3n(), PADDING3)
    assert not report.passed and not report["layer 0: dL/dW_k"].passed and report["layer 2: dL/dW_q"].passed


def test_v_norm_is_its_formula_with_central_differences_recompute_and_decoding(rng):
    """The values as attended: each head of x W_vᵀ + b_v divided by sqrt(mean of its squares + eps), no weight."""
    mha, eps = module(v_norm=True, v_norm_eps=1e-5), 1e-5
    x, mask = rng.standard_normal((B, L, E)), masks.causal_mask(L)
    out, cache = mha.forward(x, x, x, mask=mask)
    v = (x @ mha.params["W_v"].T + mha.params["b_v"]).reshape(B, L, HKV, D).transpose(0, 2, 1, 3)  # (B, Hkv, L, d)
    np.testing.assert_allclose(cache.V, v / np.sqrt((v * v).mean(-1, keepdims=True) + eps), rtol=0, atol=1e-14)
    plain = module()
    plain.params.update(mha.params)
    assert np.abs(out - plain.forward(x, x, x, mask=mask)[0]).max() > 1e-3 * np.abs(out).max()  # it does something
    grad_check_self_attention(mha, x, mask)
    check_recompute_and_decoding(mha, module(v_norm=True, v_norm_eps=1e-5, recompute=True), x, rng)


def test_kv_sharing_layers_decode_and_refuse_what_they_cannot_do(rng):
    """A source decodes with its KV cache; its reader reads the cache's K, V under a bottom-right mask and gives
    the rows of one full forward. Recompute, a reader's cache, a wrong key, gradients for a layer without readers:
    ValueError naming the argument."""
    from mha_numpy.kv_sharing import shared_kv_forward

    kw = dict(num_kv_heads=HKV, rope_theta=50.0, qk_norm=True, v_norm=True, rng=0)
    src, reader = MultiHeadAttention(E, H, kv_sharing="store", **kw), MultiHeadAttention(E, H, kv_sharing="reuse", **kw)
    x1, x2 = rng.standard_normal((B, L, E)), rng.standard_normal((B, L, E))
    (_, full), _ = shared_kv_forward([src, reader], [x1, x2], [0, 0], [masks.causal_mask(L)] * 2)
    kv = KVCache()
    src.forward(x1[:, :4], kv_cache=kv)
    steps = []
    for t in range(4, L + 1):
        if t > 4:
            src.forward(x1[:, t - 1 : t], kv_cache=kv)
        mask = masks.causal_mask(1, t, align="bottom-right")
        steps.append(reader.forward(x2[:, t - 1 : t], kv.keys, kv.values, mask=mask, positions=[t - 1])[0])
    assert np.abs(np.concatenate(steps, axis=1) - full[:, 3:]).max() <= 1e-12 * np.abs(full).max()
    with pytest.raises(ValueError, match="kv_sharing with recompute=True is not supported"):
        MultiHeadAttention(E, H, kv_sharing="store", recompute=True, rng=0).forward(x1)
    with pytest.raises(ValueError, match="kv_cache with kv_sharing is not supported"):
        reader.forward(x2[:, :1], kv.keys, kv.values, kv_cache=KVCache())
    with pytest.raises(ValueError, match=r"key of a kv_sharing='reuse' layer must be its source's K or V"):
        reader.forward(x2, kv.keys[:, :, :, :2], kv.values)
    with pytest.raises(ValueError, match="d_shared_kv is for a kv_sharing='store' module"):
        plain = module()
        plain.backward(np.ones((B, L, E)), plain.forward(x1, x1, x1)[1], d_shared_kv=(kv.keys, kv.values))
    with pytest.raises(ValueError, match="kv_sharing must be None, 'store' or 'reuse'"):
        MultiHeadAttention(E, H, kv_sharing="share")


@pytest.mark.parametrize(
    "sources, message",
    [
        ([0, 2, 1], r"sources\[1\] must be an int in \[0, 1\] \(layer 1 or an earlier one"),  # points forward
        ([0, -1], r"sources\[1\] must be an int in \[0, 1\]"),
        ([0, 0, 1], r"sources\[2\] = 1 points to layer 1, which reads layer 0's K and V itself"),
        ([0, 1.0], r"sources\[1\] must be an int"),
    ],
)
def test_a_kv_sharing_index_that_points_forward_or_to_a_reader_is_refused(sources, message):
    from mha_numpy.kv_sharing import check_kv_sources

    with pytest.raises(ValueError, match=message):
        check_kv_sources(sources)


def test_a_layer_whose_kv_sharing_does_not_fit_its_source_is_refused(rng):
    from mha_numpy.kv_sharing import shared_kv_forward

    layers = [MultiHeadAttention(E, H, rng=0), MultiHeadAttention(E, H, kv_sharing="reuse", rng=0)]
    x = rng.standard_normal((B, L, E))
    with pytest.raises(ValueError, match=r"layers\[0\] has kv_sharing=None; with sources\[0\] = 0 it must be 'store'"):
        shared_kv_forward(layers, [x, x], [0, 0])
    with pytest.raises(ValueError, match="layers, inputs, sources and masks must have one entry per layer"):
        shared_kv_forward(layers, [x], [0, 0])


def test_a_gate_of_the_wrong_shape_is_refused_naming_it(rng):
    """Qwen3-Next's gate (output_gate): a W_q without the gate half, or a gate tensor of the wrong shape."""
    mha = MultiHeadAttention(E, H, output_gate=True, rng=0)
    x = rng.standard_normal((B, L, E))
    mha.params["W_q"] = mha.params["W_q"][:E]  # (H·d, E): the queries without their gates
    with pytest.raises(ValueError, match="W_q"):
        mha.forward(x, x, x)
    context = rng.standard_normal((B, H, L, D))
    with pytest.raises(ValueError, match=r"q with shape \(2, 7, 16\) must be \(B, L, 2·H·d\)"):
        F.output_gate_forward(context, rng.standard_normal((B, L, E)))
