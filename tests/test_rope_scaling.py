"""RoPE scaling (``rope_scaling=``, ``mha_numpy/rope_scaling.py``): every rope_type of transformers'
``ROPE_INIT_FUNCTIONS`` against those functions, and the numbers transformers' own rope tests pin.

- the tables: tiny configs, each field of each rope_type, against transformers' function computed in float64 (its
  ``torch.float`` / ``torch.float32`` / ``Tensor.float`` lifted to float64 for the call: ``lifted``);
- the numbers pinned by huggingface/transformers ``tests/utils/test_modeling_rope_utils.py`` at commit
  e42e4a43c16b458045aa7b0f721cfe4015680880 (LlamaConfig's defaults then: d = 128, θ = 10000,
  max_position_embeddings 2048), each to half a unit of its last printed digit;
- dynamic NTK over decoding: our module with a KVCache against ``LlamaAttention`` fed by a ``LlamaRotaryEmbedding``
  (its ``dynamic_rope_update`` state) call after call, across the original length and back;
- malformed dicts refused naming rope_scaling and the field, the dict not mutated; the module's gradients.
"""

from __future__ import annotations

import contextlib
import copy
import math
from unittest import mock

import numpy as np
import pytest
from helpers import grad_check_self_attention, rel_err, require_torch

from mha_numpy import KVCache, MultiHeadAttention, masks
from mha_numpy import rope_scaling as RS

D, THETA = 16, 100.0  # tiny heads: 8 pairs


@contextlib.contextmanager
def lifted(torch):
    """transformers' rope code in float64: it builds its tables with dtype=torch.float, torch.float32, .float() and
    the default dtype (dynamic NTK's base from a length tensor)."""
    default = torch.get_default_dtype()
    with (mock.patch.object(torch, "float", torch.float64), mock.patch.object(torch, "float32", torch.float64),
          mock.patch.object(torch.Tensor, "float", torch.Tensor.double)):  # fmt: skip
        try:
            torch.set_default_dtype(torch.float64)
            yield
        finally:
            torch.set_default_dtype(default)


def hf_table(params: dict, partial=1.0, M=64, seq_len=None, head_dim=D, theta=THETA):
    """transformers' ROPE_INIT_FUNCTIONS[rope_type] on a LlamaConfig holding ``params`` -> (inv_freq, factor)."""
    torch = require_torch()
    pytest.importorskip("transformers")
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rope = {k: v for k, v in params.items() if k != "max_position_embeddings"}
    rope.update(rope_theta=theta, **({"partial_rotary_factor": partial} if partial != 1.0 else {}))
    cfg = LlamaConfig(hidden_size=2 * head_dim, num_attention_heads=2, head_dim=head_dim, max_position_embeddings=M,
                      rope_parameters=copy.deepcopy(rope))  # fmt: skip
    with lifted(torch):
        inv_freq, factor = ROPE_INIT_FUNCTIONS[params["rope_type"]](cfg, None, seq_len=seq_len)
    assert inv_freq.dtype == torch.float64
    return inv_freq.numpy(), float(factor)


def ours(params: dict, partial=1.0, seq_len=None, head_dim=D, theta=THETA):
    s = RS.check_rope_scaling(params, "rope_scaling", theta, head_dim, partial)
    return RS.rope_frequencies(s, theta, head_dim, partial, seq_len)


LONG = [1.0, 1.5, 2.0, 3.0, 4.5, 6.0, 8.0, 12.0]  # 8 pairs
SHORT = [1.0, 1.0, 1.1, 1.2, 1.3, 1.5, 1.8, 2.0]
TABLES = {  # id: (params, partial_rotary_factor, seq_lens)
    "linear": (dict(rope_type="linear", factor=4.0), 1.0, [None]),
    "linear, partial": (dict(rope_type="linear", factor=2.5), 0.5, [None]),
    "dynamic": (dict(rope_type="dynamic", factor=2.0, max_position_embeddings=16), 1.0, [None, 8, 16, 17, 40]),
    "dynamic, partial": (dict(rope_type="dynamic", factor=3.0, max_position_embeddings=16), 0.5, [None, 33]),
    "yarn": (dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=16), 1.0, [None]),
    "yarn, wide ramp": (
        dict(
            rope_type="yarn",
            factor=8.0,
            original_max_position_embeddings=16,
            beta_fast=8.0,
            beta_slow=0.5,
            truncate=False,
        ),
        1.0,
        [None],
    ),
    "yarn, gpt-oss": (
        dict(
            rope_type="yarn",
            factor=32.0,
            beta_fast=32.0,
            beta_slow=1.0,
            truncate=False,
            original_max_position_embeddings=4096,
        ),
        1.0,
        [None],
    ),
    "yarn, deepseek mscale": (
        dict(rope_type="yarn", factor=40.0, original_max_position_embeddings=64, mscale=0.707, mscale_all_dim=1.0),
        1.0,
        [None],
    ),
    "yarn, attention_factor, partial": (
        dict(rope_type="yarn", factor=2.0, original_max_position_embeddings=512, attention_factor=0.9),
        0.5,
        [None],
    ),
    "yarn, factor from M": (
        dict(rope_type="yarn", original_max_position_embeddings=16, max_position_embeddings=64, factor=None),
        1.0,
        [None],
    ),
    "longrope": (
        dict(
            rope_type="longrope", short_factor=SHORT, long_factor=LONG, original_max_position_embeddings=16, factor=4.0
        ),
        1.0,
        [None, 16, 17, 50],
    ),
    "longrope, factor from M, partial": (
        dict(
            rope_type="longrope",
            short_factor=SHORT[:4],
            long_factor=LONG[:4],
            original_max_position_embeddings=16,
            max_position_embeddings=128,
        ),
        0.5,
        [8, 20],
    ),
    "llama3": (
        dict(
            rope_type="llama3",
            factor=8.0,
            original_max_position_embeddings=32,
            low_freq_factor=1.0,
            high_freq_factor=4.0,
        ),
        1.0,
        [None],
    ),
    "proportional": (dict(rope_type="proportional"), 0.5, [None]),
    "proportional, factor": (dict(rope_type="proportional", factor=2.0), 0.25, [None]),
}


@pytest.mark.parametrize("case", list(TABLES))
def test_every_table_matches_transformers_function(case):
    """inv_freq and the attention factor of each rope_type, against transformers' function in float64."""
    params, partial, seq_lens = TABLES[case]
    for seq_len in seq_lens:
        M = params.get("max_position_embeddings") or 64
        theirs, their_factor = hf_table(params, partial, M=M, seq_len=seq_len)
        inv_freq, factor = ours(params, partial, seq_len)
        assert inv_freq.shape == theirs.shape and inv_freq.dtype == np.float64, (case, seq_len)
        assert rel_err(inv_freq, theirs) <= 1e-14 and math.isclose(factor, their_factor, rel_tol=1e-15), (case, seq_len)


def test_the_tables_change_what_they_should():
    """The fields matter (a check that could not fail otherwise): dynamic and longrope by the length, YaRN's ramp
    between the default and the interpolated table, llama3's three bands, proportional's zeros."""
    omega = RS.default_frequencies(THETA, D)
    dyn = TABLES["dynamic"][0]
    assert np.array_equal(ours(dyn, seq_len=16)[0], omega) and np.all(ours(dyn, seq_len=40)[0][1:] < omega[1:])
    lr = TABLES["longrope"][0]
    assert np.allclose(ours(lr, seq_len=16)[0], omega / SHORT) and np.allclose(ours(lr, seq_len=17)[0], omega / LONG)
    yarn, _ = ours(TABLES["yarn, wide ramp"][0])
    assert yarn[0] == omega[0] and np.isclose(yarn[-1], omega[-1] / 8) and np.all(yarn <= omega)
    assert np.any((yarn > omega / 8 * (1 + 1e-9)) & (yarn < omega * (1 - 1e-9)))  # the ramp itself
    ll, _ = ours(TABLES["llama3"][0])
    assert ll[0] == omega[0] and np.isclose(ll[-1], omega[-1] / 8) and np.any((ll < omega) & (ll > omega / 8))
    prop, _ = ours(TABLES["proportional"][0], partial=0.5)
    assert prop.shape == (D // 2,) and np.all(prop[:4] > 0) and np.all(prop[4:] == 0)


# --------------------------------------------------------------------------- transformers' pinned numbers

# huggingface/transformers tests/utils/test_modeling_rope_utils.py @ e42e4a43c16b458045aa7b0f721cfe4015680880
# fmt: off
PINNED_DEFAULT = [
    1.0000e+00, 8.6596e-01, 7.4989e-01, 6.4938e-01, 5.6234e-01, 4.8697e-01, 4.2170e-01, 3.6517e-01, 3.1623e-01,
    2.7384e-01, 2.3714e-01, 2.0535e-01, 1.7783e-01, 1.5399e-01, 1.3335e-01, 1.1548e-01, 1.0000e-01, 8.6596e-02,
    7.4989e-02, 6.4938e-02, 5.6234e-02, 4.8697e-02, 4.2170e-02, 3.6517e-02, 3.1623e-02, 2.7384e-02, 2.3714e-02,
    2.0535e-02, 1.7783e-02, 1.5399e-02, 1.3335e-02, 1.1548e-02, 1.0000e-02, 8.6596e-03, 7.4989e-03, 6.4938e-03,
    5.6234e-03, 4.8697e-03, 4.2170e-03, 3.6517e-03, 3.1623e-03, 2.7384e-03, 2.3714e-03, 2.0535e-03, 1.7783e-03,
    1.5399e-03, 1.3335e-03, 1.1548e-03, 1.0000e-03, 8.6596e-04, 7.4989e-04, 6.4938e-04, 5.6234e-04, 4.8697e-04,
    4.2170e-04, 3.6517e-04, 3.1623e-04, 2.7384e-04, 2.3714e-04, 2.0535e-04, 1.7783e-04, 1.5399e-04, 1.3335e-04,
    1.1548e-04,
]
PINNED_DYNAMIC = [  # factor 10, seq_len 16384
    1.0000e+00, 8.0931e-01, 6.5498e-01, 5.3008e-01, 4.2900e-01, 3.4720e-01, 2.8099e-01, 2.2741e-01, 1.8404e-01,
    1.4895e-01, 1.2055e-01, 9.7558e-02, 7.8955e-02, 6.3899e-02, 5.1714e-02, 4.1853e-02, 3.3872e-02, 2.7413e-02,
    2.2185e-02, 1.7955e-02, 1.4531e-02, 1.1760e-02, 9.5176e-03, 7.7027e-03, 6.2339e-03, 5.0451e-03, 4.0831e-03,
    3.3045e-03, 2.6744e-03, 2.1644e-03, 1.7517e-03, 1.4176e-03, 1.1473e-03, 9.2852e-04, 7.5146e-04, 6.0817e-04,
    4.9220e-04, 3.9834e-04, 3.2238e-04, 2.6091e-04, 2.1115e-04, 1.7089e-04, 1.3830e-04, 1.1193e-04, 9.0585e-05,
    7.3312e-05, 5.9332e-05, 4.8018e-05, 3.8861e-05, 3.1451e-05, 2.5453e-05, 2.0600e-05, 1.6672e-05, 1.3492e-05,
    1.0920e-05, 8.8374e-06, 7.1522e-06, 5.7883e-06, 4.6845e-06, 3.7912e-06, 3.0683e-06, 2.4832e-06, 2.0097e-06,
    1.6265e-06,
]
PINNED_YARN = [  # factor 10, beta_fast 32, beta_slow 1 (original length: the config's 2048)
    1.0000e+00, 8.6596e-01, 7.4989e-01, 6.4938e-01, 5.6234e-01, 4.8697e-01, 4.2170e-01, 3.6517e-01, 3.1623e-01,
    2.7384e-01, 2.3714e-01, 2.0535e-01, 1.7783e-01, 1.5399e-01, 1.3335e-01, 1.1548e-01, 1.0000e-01, 8.3479e-02,
    6.9590e-02, 5.7925e-02, 4.8136e-02, 3.9931e-02, 3.3061e-02, 2.7315e-02, 2.2515e-02, 1.8512e-02, 1.5177e-02,
    1.2403e-02, 1.0101e-02, 8.1924e-03, 6.6143e-03, 5.3120e-03, 4.2400e-03, 3.3599e-03, 2.6396e-03, 2.0520e-03,
    1.5746e-03, 1.1882e-03, 8.7713e-04, 6.2810e-04, 4.3007e-04, 2.7384e-04, 2.3714e-04, 2.0535e-04, 1.7783e-04,
    1.5399e-04, 1.3335e-04, 1.1548e-04, 1.0000e-04, 8.6596e-05, 7.4989e-05, 6.4938e-05, 5.6234e-05, 4.8697e-05,
    4.2170e-05, 3.6517e-05, 3.1623e-05, 2.7384e-05, 2.3714e-05, 2.0535e-05, 1.7783e-05, 1.5399e-05, 1.3335e-05,
    1.1548e-05,
]
PINNED_LLAMA3 = [  # factor 10, original 2048, low_freq_factor 1, high_freq_factor 4
    1.0000e+00, 8.6596e-01, 7.4989e-01, 6.4938e-01, 5.6234e-01, 4.8697e-01, 4.2170e-01, 3.6517e-01, 3.1623e-01,
    2.7384e-01, 2.3714e-01, 2.0535e-01, 1.7783e-01, 1.5399e-01, 1.3335e-01, 1.1548e-01, 1.0000e-01, 8.6596e-02,
    7.4989e-02, 6.4938e-02, 5.6234e-02, 4.8697e-02, 4.2170e-02, 3.6517e-02, 3.1623e-02, 2.7384e-02, 2.3714e-02,
    2.0535e-02, 1.7783e-02, 1.5399e-02, 1.3335e-02, 1.0730e-02, 7.7785e-03, 5.6009e-03, 3.9991e-03, 2.8248e-03,
    1.9675e-03, 1.3449e-03, 8.9549e-04, 5.7363e-04, 3.4539e-04, 2.7384e-04, 2.3714e-04, 2.0535e-04, 1.7783e-04,
    1.5399e-04, 1.3335e-04, 1.1548e-04, 1.0000e-04, 8.6596e-05, 7.4989e-05, 6.4938e-05, 5.6234e-05, 4.8697e-05,
    4.2170e-05, 3.6517e-05, 3.1623e-05, 2.7384e-05, 2.3714e-05, 2.0535e-05, 1.7783e-05, 1.5399e-05, 1.3335e-05,
    1.1548e-05,
]
# fmt: on


def assert_as_printed(values, pinned):
    """Each value within half a unit of the last of the 5 significant digits it is printed with."""
    values, pinned = np.asarray(values), np.asarray(pinned)
    half_unit = 0.5e-4 * 10.0 ** np.floor(np.log10(np.abs(pinned)))
    assert values.shape == pinned.shape and np.all(np.abs(values - pinned) <= half_unit * (1 + 1e-9)), (
        np.abs(values - pinned) / half_unit
    ).max()


def pinned_table(params, seq_len=None):
    return ours(params, seq_len=seq_len, head_dim=128, theta=10000.0)


def test_transformers_pinned_tables():
    """test_default/dynamic/yarn/llama3_rope_numerically's snapshots, and linear's rule (default / factor)."""
    omega = RS.default_frequencies(10000.0, 128)
    assert_as_printed(omega, PINNED_DEFAULT)
    for factor in (2.0, 10.0, 20.0):
        inv, attention = pinned_table(dict(rope_type="linear", factor=factor))
        assert attention == 1.0 and np.array_equal(inv, omega / factor)
    dynamic = dict(rope_type="dynamic", factor=10.0, max_position_embeddings=2048)
    assert np.array_equal(pinned_table(dynamic)[0], omega) and np.array_equal(pinned_table(dynamic, 1)[0], omega)
    assert_as_printed(pinned_table(dynamic, 16384)[0], PINNED_DYNAMIC)
    assert_as_printed(pinned_table(dict(rope_type="yarn", factor=10.0, beta_fast=32, beta_slow=1,
                                        original_max_position_embeddings=2048))[0], PINNED_YARN)  # fmt: skip
    llama3 = dict(rope_type="llama3", factor=10.0, original_max_position_embeddings=2048, low_freq_factor=1,
                  high_freq_factor=4)  # fmt: skip
    inv, attention = pinned_table(llama3)
    assert attention == 1.0
    assert_as_printed(inv, PINNED_LLAMA3)


def test_transformers_pinned_attention_factors():
    """YaRN's 0.1 ln(factor) + 1 and LongRoPE's √(1 + ln(factor) / ln(2048)), or the given attention_factor (the
    pinned test's equalities); LongRoPE's short factors below the original length."""
    short, long = [2.0] * 64, list(np.arange(1.0, 65.0))
    for factor in (2.0, 10.0, 20.0):
        yarn = dict(rope_type="yarn", factor=factor, original_max_position_embeddings=2048)
        assert pinned_table(yarn)[1] == 0.1 * math.log(factor) + 1.0
        assert pinned_table({**yarn, "attention_factor": 0.5})[1] == 0.5
        lr = dict(rope_type="longrope", factor=factor, short_factor=short, long_factor=long,
                  original_max_position_embeddings=2048)  # fmt: skip
        assert pinned_table(lr)[1] == math.sqrt(1 + math.log(factor) / math.log(2048))
        assert pinned_table({**lr, "attention_factor": 0.5}, seq_len=1)[1] == 0.5
        assert np.array_equal(pinned_table(lr)[0], RS.default_frequencies(10000.0, 128) / np.array(short))


# --------------------------------------------------------------------------- malformed dicts

YARN = dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=16)
BAD = [
    ("yarn", "must be a dict"),
    (dict(factor=2.0), r"rope_scaling\['rope_type'\] must be one of"),
    (dict(rope_type="ntk", factor=2.0), r"rope_scaling\['rope_type'\] must be one of .*'ntk'"),
    (dict(rope_type="linear"), r"needs rope_scaling\['factor'\]"),
    (dict(rope_type="linear", factor=2.0, beta_fast=3.0), r"rope_scaling\['beta_fast'\] is not a field of .*linear"),
    (dict(rope_type="linear", factor="2"), r"rope_scaling\['factor'\] must be a number"),
    (dict(rope_type="linear", factor=True), r"rope_scaling\['factor'\] must be a number"),
    (dict(rope_type="linear", factor=-1.0), r"rope_scaling\['factor'\] must be a finite number > 0"),
    (dict(rope_type="linear", factor=float("nan")), r"rope_scaling\['factor'\] must be a finite number"),
    (dict(rope_type="dynamic", factor=2.0), r"needs rope_scaling\['max_position_embeddings'\]"),
    (dict(YARN, original_max_position_embeddings=16.5), r"rope_scaling\['original_max_position_embeddings'\]"),
    (dict(YARN, truncate=1), r"rope_scaling\['truncate'\] must be True or False"),
    (dict(YARN, factor=None), r"needs rope_scaling\['factor'\] \(or max_position_embeddings"),
    (dict(rope_type="yarn", factor=4.0), r"needs rope_scaling\['original_max_position_embeddings'\]"),
    (
        dict(
            rope_type="longrope",
            short_factor=[1.0] * 7,
            long_factor=[1.0] * 8,
            original_max_position_embeddings=4,
            factor=2.0,
        ),
        r"rope_scaling\['short_factor'\] must have 8 entries",
    ),
    (
        dict(
            rope_type="longrope",
            short_factor="1.0",
            long_factor=[1.0] * 8,
            original_max_position_embeddings=4,
            factor=2.0,
        ),
        r"rope_scaling\['short_factor'\] must be a list",
    ),
    (
        dict(
            rope_type="longrope",
            short_factor=[1.0] * 8,
            long_factor=[1.0] * 7 + [0.0],
            original_max_position_embeddings=4,
            factor=2.0,
        ),
        r"rope_scaling\['long_factor'\]\[7\]",
    ),
    (
        dict(
            rope_type="llama3",
            factor=8.0,
            original_max_position_embeddings=8,
            low_freq_factor=4.0,
            high_freq_factor=4.0,
        ),
        r"rope_scaling\['high_freq_factor'\] must be above",
    ),
    (dict(YARN, rope_theta=10.0), r"rope_scaling\['rope_theta'\]=10.0 differs from the module's rope_theta"),
    (dict(YARN, partial_rotary_factor=0.5), r"rope_scaling\['partial_rotary_factor'\]"),
]


@pytest.mark.parametrize("bad, match", BAD, ids=[str(m)[:40] for _, m in BAD])
def test_malformed_dicts_are_refused_naming_the_argument(bad, match):
    given = copy.deepcopy(bad)
    with pytest.raises(ValueError, match=match):
        MultiHeadAttention(2 * D, 2, rope_theta=THETA, rope_scaling=bad)
    assert bad == given  # not mutated


def test_rope_scaling_needs_rope_theta_and_a_dynamic_table_needs_two_pairs():
    with pytest.raises(ValueError, match="rope_scaling scales RoPE's frequencies: it needs rope_theta"):
        MultiHeadAttention(8, 2, rope_scaling=YARN)
    with pytest.raises(ValueError, match="rope_type 'dynamic' turns 2 features"):
        MultiHeadAttention(8, 2, head_dim=4, rope_theta=THETA, partial_rotary_factor=0.5,
                           rope_scaling=dict(rope_type="dynamic", factor=2.0, max_position_embeddings=4))  # fmt: skip


def test_transformers_rope_parameters_are_taken_as_they_are():
    """A config's rope_parameters (rope_theta and partial_rotary_factor in it, equal to the module's) is accepted;
    rope_type "default" is no scaling at all; the option shows in repr and is hashable."""
    params = dict(YARN, rope_theta=THETA, partial_rotary_factor=0.5)
    mha = MultiHeadAttention(2 * D, 2, rope_theta=THETA, partial_rotary_factor=0.5, rope_scaling=params)
    assert mha.config.rope_scaling.as_dict() == YARN and "rope_scaling=RopeScaling(" in repr(mha)
    assert hash(mha.config) == hash(mha.config.replace())
    plain = MultiHeadAttention(2 * D, 2, rope_theta=THETA, rope_scaling={"rope_type": "default"})
    assert plain.config.rope_scaling is None and "rope_scaling" not in repr(plain)


# --------------------------------------------------------------------------- the module


GRAD_CASES = {  # head_dim 8: 4 pairs
    "yarn, partial": (
        dict(rope_type="yarn", factor=8.0, original_max_position_embeddings=16, beta_fast=8.0, beta_slow=0.5),
        0.5,
    ),
    "dynamic past M": (dict(rope_type="dynamic", factor=2.0, max_position_embeddings=3), 1.0),
    "longrope past original": (
        dict(
            rope_type="longrope",
            short_factor=SHORT[:4],
            long_factor=LONG[:4],
            original_max_position_embeddings=3,
            factor=2.0,
        ),
        1.0,
    ),
    "proportional": (dict(rope_type="proportional", factor=2.0), 0.5),
}


@pytest.mark.parametrize("case", list(GRAD_CASES))
def test_the_module_gradchecks_with_scaled_tables(case):
    """float64 central differences of the module (GQA, a causal mask, 5 positions) with a table and its
    attention factor; dynamic and longrope past their original length (the long table)."""
    params, partial = GRAD_CASES[case]
    mha = MultiHeadAttention(8, 2, num_kv_heads=1, head_dim=8, rope_theta=THETA, partial_rotary_factor=partial,
                             rope_scaling=params, rng=0)  # fmt: skip
    x = np.random.default_rng(1).standard_normal((2, 5, 8))
    grad_check_self_attention(mha, x, mask=masks.causal_mask(5))


# --------------------------------------------------------------------------- dynamic NTK across decoding


def test_dynamic_ntk_decoding_matches_transformers_dynamic_update():
    """Our module with a KVCache against LlamaAttention whose (cos, sin) come, call after call, from one
    LlamaRotaryEmbedding (``dynamic_rope_update``'s state) in float64: a prefill below the original length M = 6,
    single tokens across it (transformers recomputes the table at each new length, ours by the call's length),
    then a new sequence shorter than M (transformers resets to the original table; ours is the default table
    there). Cached keys keep the rotation they were cached with, in both."""
    torch = require_torch()
    pytest.importorskip("transformers")
    from transformers import DynamicCache, LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaAttention, LlamaRotaryEmbedding

    from mha_numpy.interop.llama import causal_tensor, from_hf_llama_attention

    M, E = 6, 2 * D
    rope = dict(rope_type="dynamic", factor=3.0)
    cfg = LlamaConfig(hidden_size=E, num_attention_heads=4, num_key_value_heads=2, head_dim=D, attention_bias=True,
                      max_position_embeddings=M, rope_parameters=dict(rope, rope_theta=THETA),
                      attn_implementation="sdpa")  # fmt: skip
    torch.manual_seed(0)
    module = LlamaAttention(cfg, layer_idx=0).double().eval()
    with lifted(torch):
        rotary = LlamaRotaryEmbedding(cfg)
    mha = MultiHeadAttention(E, 4, num_kv_heads=2, head_dim=D, rope_theta=THETA,
                             rope_scaling=dict(rope, max_position_embeddings=M), rng=0)  # fmt: skip
    mha.params.update(from_hf_llama_attention(_default_rope_copy(module)).params)
    x = np.random.default_rng(4).standard_normal((2, 10, E))
    for calls in ([(0, 4), *((t, t + 1) for t in range(4, 10))], [(0, 3), (3, 4)]):  # across M, then a new short one
        kv, hf_cache = KVCache(), DynamicCache(config=cfg)
        for a, b in calls:
            ours_out = mha.forward(*(x[:, a:b],) * 3, mask=masks.causal_mask(b - a, b, diagonal=a), kv_cache=kv)[0]
            pos = torch.arange(a, b)[None].expand(2, -1)
            with lifted(torch), torch.no_grad():
                cos_sin = rotary(torch.from_numpy(x[:, a:b]), pos)
                theirs = module(torch.from_numpy(x[:, a:b]), cos_sin, causal_tensor(torch, b - a, b, np.float64),
                                cache=hf_cache)[0].numpy()  # fmt: skip
            assert rel_err(ours_out, theirs) <= 1e-12, (a, b)
    assert rotary.max_seq_len_cached == M  # transformers went past M and came back (the reset), as our table did


def _default_rope_copy(module):
    """A LlamaAttention with the same weights and a default-rope config, for the importer (which refuses scaling
    on Llama: only the weights are read here)."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaAttention

    cfg = LlamaConfig(**{**module.config.to_dict(), "rope_parameters": {"rope_type": "default", "rope_theta": THETA}})
    cfg._attn_implementation = "sdpa"
    copy_ = LlamaAttention(cfg, layer_idx=0).double()
    copy_.load_state_dict(module.state_dict())
    return copy_


# --------------------------------------------------------------------------- gpt-oss's own test configuration


def gpt_oss_test_attention(window, dtype=np.float64):
    """The attention of GptOssModelTester's config (huggingface/transformers tests/models/gpt_oss/
    test_modeling_gpt_oss.py @ 3e7da9f11075a6e34d572fe04d28485a3989d274, its sizes from tests/causal_lm_tester.py
    @ 2b6c089d5a0b18d59a08c36b91404ece60915cf3: hidden 32, 2 heads, 2 key/value heads, head_dim 32 // 2,
    max_position_embeddings 512) with GptOssConfig's own rope_parameters (YaRN, factor 32, beta 32 / 1,
    truncate False, original length 4096, θ 150000) and sliding window (128; layer 0 sliding, layer 1 full)."""
    from mha_numpy.interop.gpt_oss import hf_gpt_oss_attention

    return hf_gpt_oss_attention(32, 2, 2, head_dim=16, sliding_window=window, rope_parameters="gpt-oss",
                                max_position_embeddings=512, dtype=dtype)  # fmt: skip


@pytest.mark.parametrize("impl", ["vectorized", "naive", "chunked"])
@pytest.mark.parametrize("window", [128, None], ids=["sliding", "full"])
def test_gpt_oss_own_test_config_imports_and_matches(window, impl):
    """Its YaRN config imports (rope_scaling from its rope_parameters) and matches GptOssAttention on every kernel:
    outputs, weights, Q and K after RoPE and every gradient to 1e-10 in float64, a padded batch of 2 × 7 tokens
    (the tester's seq_length)."""
    require_torch()
    pytest.importorskip("transformers")
    from mha_numpy import kernels
    from mha_numpy.interop.gpt_oss import crosscheck_hf_gpt_oss_attention, from_hf_gpt_oss_attention

    module = gpt_oss_test_attention(window)
    mha = from_hf_gpt_oss_attention(module)
    assert mha.config.rope_scaling.as_dict() == dict(rope_type="yarn", factor=32.0, beta_fast=32.0, beta_slow=1.0,
                                                     truncate=False, original_max_position_embeddings=4096,
                                                     max_position_embeddings=512)  # fmt: skip
    assert mha.rope_theta == 150000.0 and mha.head_dim == 16
    x = np.random.default_rng(5).standard_normal((2, 7, 32))
    keep = np.array([[1, 1, 1, 1, 1, 1, 0], [0, 0, 1, 1, 1, 1, 1]])
    kernel = kernels.get_kernel(impl, **({"block_size": 3, "num_threads": 2} if impl == "chunked" else {}))
    report = crosscheck_hf_gpt_oss_attention(module, x, attention_mask=keep, impl=kernel)
    assert report.passed and report.rtol == 1e-10, str(report)
    assert {"dL/dsinks", "Q after RoPE", "dL/dW_q"} <= {r.name for r in report.rows}


def test_gpt_oss_own_test_config_decodes_and_float32():
    """Decoding it with a KVCache against GptOssAttention's DynamicCache (float64), and float32 within 1e-5."""
    require_torch()
    pytest.importorskip("transformers")
    from mha_numpy.interop.gpt_oss import crosscheck_hf_gpt_oss_attention, crosscheck_hf_gpt_oss_kv_cache

    x = np.random.default_rng(6).standard_normal((2, 7, 32))
    report = crosscheck_hf_gpt_oss_kv_cache(gpt_oss_test_attention(None), x, prefill=3)
    assert report.passed, str(report)
    report = crosscheck_hf_gpt_oss_attention(gpt_oss_test_attention(128, np.float32), x)
    assert report.passed and report.rtol == 1e-5, str(report)


# --------------------------------------------------------------------------- the two pair layouts


def halves_order(d: int, turned: int) -> np.ndarray:
    """The permutation from the interleaved layout to the half-split one: the turned features' evens, then their
    odds (pair i at (i, i + n)), the rest in place."""
    return np.concatenate([np.arange(0, turned, 2), np.arange(1, turned, 2), np.arange(turned, d)])


def test_the_same_vector_rotated_both_ways_is_equal_after_the_permutation():
    """rotary(x, interleaved) permuted to halves == rotary(x permuted to halves, half-split), bit for bit, on a
    partial head with a scaled table (and the same for the backward); DeepSeek's form (rope_interleaved_forward)
    is the interleaved turn with its output gathered into halves."""
    from mha_numpy import functional as F

    rng = np.random.default_rng(7)
    x, d_out = rng.standard_normal((2, 3, 5, 10)), rng.standard_normal((2, 3, 5, 10))
    inv_freq, factor = ours(dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=4), head_dim=6)
    perm = halves_order(10, 6)  # 3 pairs turned of 10 features
    inter, cache_i = F.rotary_forward(x, None, inv_freq, factor, interleaved=True)
    half, cache_h = F.rotary_forward(x[..., perm], None, inv_freq, factor, interleaved=False)
    assert np.array_equal(inter[..., perm], half) and not np.allclose(inter, half)
    assert np.array_equal(F.rotary_backward(d_out, cache_i)[..., perm], F.rotary_backward(d_out[..., perm], cache_h))
    y = rng.standard_normal((2, 3, 5, 6))
    deepseek, _ = F.rope_interleaved_forward(y, None, 30.0)
    gptj, _ = F.rotary_forward(y, None, RS.default_frequencies(30.0, 6), interleaved=True)
    assert np.array_equal(deepseek, gptj[..., halves_order(6, 6)])


def test_the_interleaved_turn_is_gpt_j_and_llama4_complex_form():
    """Against GPT-J's rotate_every_two written out and Llama 4's complex product (x_2i + i x_2i+1) e^(i θ),
    independent of the pair."""
    from mha_numpy import functional as F

    rng = np.random.default_rng(8)
    x, pos = rng.standard_normal((2, 2, 4, 8)), rng.integers(0, 50, size=(2, 4))
    inv_freq = 1.0 / 20.0 ** (np.arange(0, 8, 2) / 8)
    out, _ = F.rotary_forward(x, pos, inv_freq, 1.25, interleaved=True)
    angles = pos[:, None, :, None] * inv_freq  # (B, 1, L, 4)
    cos, sin = np.repeat(np.cos(angles), 2, axis=-1), np.repeat(np.sin(angles), 2, axis=-1)  # (B, 1, L, 8)
    every_two = np.stack([-x[..., 1::2], x[..., 0::2]], axis=-1).reshape(x.shape)  # GPT-J's rotate_every_two
    assert rel_err(out, 1.25 * (x * cos + every_two * sin)) <= 1e-15
    z = (x[..., 0::2] + 1j * x[..., 1::2]) * np.exp(1j * angles) * 1.25  # Llama 4's view_as_complex · freqs_cis
    assert rel_err(out, np.stack([z.real, z.imag], axis=-1).reshape(x.shape)) <= 1e-15


def test_the_module_with_interleaved_pairs_is_the_half_split_module_with_permuted_projections():
    """rope_interleave=True (partial, scaled) equals the half-split module whose W_q, W_k rows (and biases) are
    permuted to halves within each head: the layouts differ by a permutation of q and k alike, which q·k does not
    see; and it gradchecks."""
    options = dict(num_kv_heads=1, head_dim=8, rope_theta=THETA, partial_rotary_factor=0.75, rng=0,
                   rope_scaling=dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=4))  # fmt: skip
    inter = MultiHeadAttention(16, 2, rope_interleave=True, **options)
    half = MultiHeadAttention(16, 2, **options)
    perm = halves_order(8, 6)
    for name, heads in (("W_q", 2), ("W_k", 1), ("b_q", 2), ("b_k", 1)):
        rows = np.concatenate([h * 8 + perm for h in range(heads)])
        inter.params[name] += np.random.default_rng(len(name)).normal(0, 0.3, inter.params[name].shape)
        half.params[name] = inter.params[name][rows]
    for name in ("W_v", "b_v", "W_o", "b_o"):
        half.params[name] = inter.params[name]
    x, mask = np.random.default_rng(9).standard_normal((2, 5, 16)), masks.causal_mask(5)
    out_i, out_h = inter.forward(x, x, x, mask=mask)[0], half.forward(x, x, x, mask=mask)[0]
    assert rel_err(out_i, out_h) <= 1e-14
    plain = MultiHeadAttention(16, 2, **{**options, "rope_scaling": None})
    plain.params.update(half.params)
    assert rel_err(plain.forward(x, x, x, mask=mask)[0], out_h) > 1e-3  # the table matters here
    grad_check_self_attention(inter, x[:, :4], mask=masks.causal_mask(4))


def test_rope_interleave_is_checked_and_defaults_by_family():
    with pytest.raises(ValueError, match="rope_interleave must be True or False"):
        MultiHeadAttention(8, 2, rope_theta=THETA, rope_interleave=1)
    assert MultiHeadAttention(8, 2, rope_theta=THETA).config.rope_interleave is False
    from mha_numpy import MultiHeadLatentAttention

    mla = MultiHeadLatentAttention(8, 2, kv_lora_rank=3, qk_rope_head_dim=2, qk_nope_head_dim=2, v_head_dim=2)
    assert mla.config.rope_interleave is True  # DeepSeek's default


# --------------------------------------------------------------------------- every kernel, recompute, the KV cache

STATIC = {  # the tables that do not depend on the length: decoding token by token is the full forward
    "yarn, interleaved, partial": dict(
        rope_scaling=dict(
            rope_type="yarn", factor=4.0, original_max_position_embeddings=3, beta_fast=4.0, beta_slow=0.5
        ),
        rope_interleave=True,
        partial_rotary_factor=0.5,
    ),  # fmt: skip
    "llama3": dict(
        rope_scaling=dict(
            rope_type="llama3",
            factor=4.0,
            original_max_position_embeddings=4,
            low_freq_factor=1.0,
            high_freq_factor=2.0,
        )
    ),  # fmt: skip
    "proportional, interleaved": dict(
        rope_scaling=dict(rope_type="proportional", factor=1.5), rope_interleave=True, partial_rotary_factor=0.5
    ),  # fmt: skip
}


@pytest.mark.parametrize("impl", ["vectorized", "naive", "chunked", "auto"])
@pytest.mark.parametrize("case", list(STATIC))
def test_scaled_rope_on_every_kernel_with_recompute_and_the_kv_cache(case, impl):
    """recompute=True gives the default path's output and gradients, decoding token by token the full forward."""
    from helpers import check_recompute_and_decoding

    from mha_numpy import kernels

    kernel = dict(block_size=2, num_threads=2) if impl == "chunked" else {}
    options = dict(num_kv_heads=2, head_dim=8, rope_theta=THETA, rng=0, **STATIC[case])
    default = MultiHeadAttention(16, 4, impl=kernels.get_kernel(impl, **kernel), **options)
    lean = MultiHeadAttention(16, 4, impl=kernels.get_kernel(impl, **kernel), recompute=True, **options)
    lean.params.update(default.params)
    check_recompute_and_decoding(default, lean, np.random.default_rng(10).standard_normal((2, 6, 16)),
                                 np.random.default_rng(11))  # fmt: skip


@pytest.mark.parametrize("case", ["dynamic past M", "longrope past original"])
def test_length_dependent_tables_with_recompute_see_the_call_length(case):
    """dynamic and longrope read the call's length in every head group of recompute=True, as in the default path;
    decoding past the original length differs from the full forward by the keys cached with the shorter table, as
    transformers' does (test_dynamic_ntk_decoding_matches_transformers_dynamic_update)."""
    from mha_numpy import kernels

    params, _ = GRAD_CASES[case]
    options = dict(num_kv_heads=1, head_dim=8, rope_theta=THETA, rope_scaling=params, rng=0)
    default = MultiHeadAttention(8, 2, impl=kernels.get_kernel("chunked", block_size=2), **options)
    lean = MultiHeadAttention(8, 2, impl=kernels.get_kernel("chunked", block_size=2), recompute=True, **options)
    lean.params.update(default.params)
    x, mask = np.random.default_rng(12).standard_normal((2, 6, 8)), masks.causal_mask(6)
    out, cache = default.forward(x, x, x, mask=mask)
    out_r, cache_r = lean.forward(x, x, x, mask=mask)
    d_out = np.random.default_rng(13).standard_normal(out.shape)
    grads, grads_r = default.backward(d_out, cache), lean.backward(d_out, cache_r)
    assert rel_err(out_r, out) <= 1e-13 and all(rel_err(grads_r[n], grads[n]) <= 1e-13 for n in grads)
    kv = KVCache()
    steps = np.concatenate([default.forward(*(x[:, t : t + 1],) * 3, kv_cache=kv)[0] for t in range(6)], axis=1)
    short = default.forward(x[:, :3], x[:, :3], x[:, :3], mask=masks.causal_mask(3))[0]  # within the original length
    assert rel_err(steps[:, :3], short) <= 1e-13 and rel_err(steps[:, -1], out[:, -1]) > 1e-6


def test_a_checked_table_is_checked_again_for_another_head():
    """A RopeScaling passed on (config.replace, another module) is checked against the new sizes: LongRoPE's
    lists must fit the new head."""
    lr = dict(
        rope_type="longrope", short_factor=SHORT, long_factor=LONG, original_max_position_embeddings=4, factor=2.0
    )
    mha = MultiHeadAttention(2 * D, 2, rope_theta=THETA, rope_scaling=lr)
    with pytest.raises(ValueError, match=r"rope_scaling\['short_factor'\] must have 4 entries"):
        MultiHeadAttention(16, 2, rope_theta=THETA, rope_scaling=mha.config.rope_scaling)


LLAMA_TABLES = {  # LlamaAttention fed by LlamaRotaryEmbedding: what Llama 3.1 (llama3) and Phi-3 (longrope) ship
    "llama3": dict(  # wavelengths 6.3 ... 352 across the bands' bounds 64 / 16 and 64 / 1
        rope_type="llama3", factor=8.0, original_max_position_embeddings=64, low_freq_factor=1.0, high_freq_factor=16.0
    ),
    "longrope past original": dict(
        rope_type="longrope", short_factor=SHORT, long_factor=LONG, factor=2.0, original_max_position_embeddings=4
    ),
    "proportional": dict(rope_type="proportional", partial_rotary_factor=0.5, factor=2.0),
}


@pytest.mark.parametrize("case", list(LLAMA_TABLES))
def test_against_llama_attention_with_its_rotary_embedding(case):
    """Outputs, dL/dx and every parameter's gradient against LlamaAttention (sdpa, float64) given the (cos, sin)
    of its own LlamaRotaryEmbedding in float64, GQA 4 / 2, 7 causal positions, to 1e-10."""
    torch = require_torch()
    pytest.importorskip("transformers")
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaAttention, LlamaRotaryEmbedding

    from mha_numpy.interop.harness import run_hf_attention, run_ours
    from mha_numpy.interop.llama import causal_tensor, from_hf_llama_attention
    from mha_numpy.interop.names import HF_LLAMA_NAME_MAP
    from mha_numpy.interop.rope import hf_rope_scaling

    cfg = LlamaConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=D, attention_bias=True,
                      max_position_embeddings=8, rope_parameters=dict(LLAMA_TABLES[case], rope_theta=THETA),
                      attn_implementation="sdpa")  # fmt: skip
    torch.manual_seed(1)
    module = LlamaAttention(cfg, layer_idx=0).double()
    with torch.no_grad():
        for p in (module.q_proj.bias, module.k_proj.bias, module.v_proj.bias, module.o_proj.bias):
            p.add_(0.1 * torch.randn_like(p))  # nonzero biases
    x, L = np.random.default_rng(14).standard_normal((2, 7, 32)), 7
    with lifted(torch):
        cos_sin = LlamaRotaryEmbedding(cfg)(torch.from_numpy(x), torch.arange(L)[None].expand(2, -1))
    partial = LLAMA_TABLES[case].get("partial_rotary_factor", 1.0)
    mha = MultiHeadAttention(32, 4, num_kv_heads=2, head_dim=D, rope_theta=THETA, partial_rotary_factor=partial,
                             rope_scaling=hf_rope_scaling(cfg), rng=0)  # fmt: skip
    mha.params.update(from_hf_llama_attention(_default_rope_copy(module)).params)
    d_out = np.random.default_rng(15).standard_normal(x.shape)
    ours, _ = run_ours(mha, (x, x, x), d_out, mask=masks.causal_mask(L))
    theirs = run_hf_attention(torch, module, x, cos_sin, causal_tensor(torch, L, L, np.float64), d_out,
                              HF_LLAMA_NAME_MAP)  # fmt: skip
    keys = ["output", "dx", *(k for k in theirs if k.startswith("grad "))]
    assert len(keys) == 10 and all(rel_err(ours[k], theirs[k]) <= 1e-10 for k in keys), {
        k: rel_err(ours[k], theirs[k]) for k in keys
    }
