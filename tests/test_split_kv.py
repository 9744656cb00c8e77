"""Split-KV attention (``kernels.SplitKVKernel``): the keys cut into S shards, each attended by another kernel, merged
by their lse. Equal to the inner kernel on all keys (1e-12 in float64, forward and every gradient), through the
kernel conformance tests that apply (run here on split kernels: it is not registered, it wraps the others), and
decoding token by token through ``MultiHeadAttention`` with a ``KVCache`` (GQA, RoPE, padding, a sliding window, sinks)
and a ``StreamingKVCache``; the one case the lse convention cannot carry (finite "minus infinity" rows) is shown.
"""

from __future__ import annotations

import numpy as np
import pytest
import test_kernels as conformance
from conftest import MASK_KINDS
from helpers import rel_err

from mha_numpy import KVCache, MultiHeadAttention, StreamingKVCache, kernels, masks
from mha_numpy.kernels.split_kv import SplitKVKernel, key_shards


def chunked():
    return kernels.ChunkedKernel(block_size=2, num_threads=1)


# (name, a split kernel): 2 shards of the conformance suite's 4 keys, 3 unequal ones, contiguous blocks, the chunked
# kernel inside, the orders
SPLITS = {
    "2-vectorized": lambda: SplitKVKernel(2),
    "3-naive-tree": lambda: SplitKVKernel(3, "naive", order="tree"),
    "2-chunked-block2": lambda: SplitKVKernel(2, chunked(), block=2, order="sequential"),
    "4-chunked": lambda: SplitKVKernel(4, chunked()),
}


def test_the_shards_partition_the_keys():
    assert [s.tolist() for s in key_shards(7, 3)] == [[0, 3, 6], [1, 4], [2, 5]]
    assert [s.tolist() for s in key_shards(7, 2, block=3)] == [[0, 1, 2, 6], [3, 4, 5]]
    assert [s.tolist() for s in key_shards(2, 4)] == [[0], [1], [], []]


# the suite's cost is its finite differences: every mask kind on the naive kernel split, a few on the chunked one
FORWARD_CASES = [("3-naive-tree", kind) for kind in MASK_KINDS if kind != "finite min"]  # 3 shards: 2, 1, 1 keys
FORWARD_CASES += [
    (split, kind) for split in ("2-chunked-block2", "4-chunked") for kind in ("causal", "fully masked rows")
]
FORWARD_CASES += [("2-vectorized", "finite min"), ("2-chunked-block2", "finite min")]


@pytest.mark.parametrize("split, kind", FORWARD_CASES)
def test_conformance_forward_weights_and_gradients(split, kind, rng):
    """Against the einsum reference (1e-12), gradient-checked, and the vectorized kernel's gradients to 1e-12. Finite
    "minus infinity" rows only with shards of equal size (the lse cannot carry more: see the test below)."""
    conformance.test_forward_weights_and_gradients_match_the_reference(SPLITS[split](), {}, kind, rng)


CONFORMANCE = [
    conformance.test_dropout_with_a_fixed_mask,
    conformance.test_sampled_dropout_is_reproduced_by_its_own_mask,
    conformance.test_fully_masked_rows_are_zero_and_gradients_finite,
    conformance.test_nan_and_inf_give_nan_rows_and_empty_inputs_are_defined,
    conformance.test_the_cache_keeps_the_contract_of_kernels_base,
    conformance.test_backward_refuses_a_wrong_d_context,
    conformance.test_a_step_that_changes_the_scores_works_with_every_kernel,
]


@pytest.mark.parametrize("test", CONFORMANCE, ids=lambda t: t.__name__.removeprefix("test_"))
@pytest.mark.parametrize("split", ["3-naive-tree", "4-chunked"])
def test_conformance(split, test, rng):
    if split == "4-chunked" and test is conformance.test_a_step_that_changes_the_scores_works_with_every_kernel:
        split = "2-vectorized"  # a module gradient check: the naive one above covers the shards, this the merge order
    test(SPLITS[split](), {}, rng)


@pytest.mark.parametrize("bias_shape", [(1, 2, 5, 4), (2, 1, 1), (2, 1, 5, 1), (4,)])
def test_conformance_bias_and_its_gradient(bias_shape, rng):
    """A bias cut with the keys (its gradient put back in its columns), or shared by every key (the shards' sum)."""
    conformance.test_score_bias_and_its_gradient(SPLITS["3-naive-tree"](), {}, bias_shape, rng)


@pytest.mark.parametrize("split", ["2-vectorized"])
def test_conformance_module_gradcheck(split, rng):
    conformance.test_module_matches_the_einsum_reference_and_gradchecks(SPLITS[split](), {}, True, True, "causal", rng)


@pytest.mark.parametrize("inner", ["vectorized", "naive", "chunked"])
def test_every_kernel_split_equals_itself_unsplit_to_1e12_with_sinks_and_a_window(inner, rng):
    """S = 1 ... 5 shards, block-cyclic or contiguous, a sliding window given by its rule and a sink per head."""
    whole_kernel = chunked() if inner == "chunked" else kernels.get_kernel(inner)
    B, H, Lq, Lk = 2, 2, 5, 9
    q, k, v = (rng.standard_normal((B, H, n, 3)) for n in (Lq, Lk, Lk))
    mask, sinks = masks.StructuredMask(Lq, Lk, causal=True, window=3, align="bottom-right"), rng.standard_normal(H)
    whole, cache = whole_kernel.forward(q, k, v, mask, sinks=sinks)
    d_context, d_lse = rng.standard_normal(whole.shape), rng.standard_normal(whole.shape[:3])
    expected = whole_kernel.backward(d_context, cache, d_lse=d_lse)
    largest = max(np.abs(g).max() for g in expected[:3])
    for S, block in [(1, 1), (2, 1), (3, 2), (4, 1), (5, 3)]:
        split = SplitKVKernel(S, whole_kernel, block=block)
        context, split_cache = split.forward(q, k, v, mask, sinks=sinks)
        assert rel_err(context, whole) <= 1e-12 and rel_err(split_cache.lse, cache.lse) <= 1e-14
        grads = split.backward(d_context, split_cache, d_lse=d_lse)
        assert all(np.abs(g - e).max() <= 1e-12 * largest for g, e in zip(grads[:3], expected[:3])), (S, block)
        assert rel_err(grads[4], expected[4]) <= 1e-12  # the sinks' gradient


def decode(mha, x, mask_for=None, kv=None, sizes=(3, 1, 1, 2, 1, 1)):
    """Prefill, then a token (or two) a call, as a decoder runs -> the outputs side by side (B, L, E)."""
    kv, outs, t = KVCache() if kv is None else kv, [], 0
    for n in sizes:
        xt = x[:, t : t + n]
        outs.append(mha.forward(xt, xt, xt, kv_cache=kv, mask=None if mask_for is None else mask_for(t, n))[0])
        t += n
    return np.concatenate(outs, axis=1)


def twins(split: SplitKVKernel, **options):
    """The same module twice (same parameters): on the split kernel and on its inner kernel."""
    a = MultiHeadAttention(8, 4, rng=0, impl=split, **options)
    b = MultiHeadAttention(8, 4, rng=0, impl=split.inner, **options)
    return a, b


@pytest.mark.parametrize("inner", ["vectorized", "chunked"])
def test_split_kv_decoding_equals_the_unsharded_decode_token_by_token(inner, rng):
    """GQA (2 key/value heads for 4 query heads), RoPE, a padded batch and a sliding window, sinks: every output of
    the split decode (3 shards of the cache) equals the unsharded decode's to 1e-12."""
    split = SplitKVKernel(3, chunked() if inner == "chunked" else inner, block=2)
    x = rng.standard_normal((2, 9, 8))
    lengths = np.array([9, 6])  # the second sequence's last 3 positions are padding

    def window_and_padding(t, n):  # (B, 1, n, t + n): bottom-right window of 4, padded keys blocked
        window = masks.sliding_window_mask(n, t + n, 4, offset=t)  # (n, t + n)
        return masks.combine_masks(window, masks.padding_mask(np.minimum(lengths, t + n), t + n))

    for options, mask_for in [(dict(num_kv_heads=2, rope_theta=50.0), None),
                              (dict(num_kv_heads=2, rope_theta=50.0, sinks=True), window_and_padding)]:  # fmt: skip
        a, b = twins(split, **options)
        ours, unsharded = decode(a, x, mask_for), decode(b, x, mask_for)
        assert rel_err(ours, unsharded) <= 1e-12, options


def test_split_kv_decoding_with_a_streaming_cache(rng):
    """StreamingLLM's cache (sink tokens and a window, evicting the rest): the split decode follows it."""
    a, b = twins(SplitKVKernel(2, "vectorized"), num_kv_heads=2, rope_theta=50.0)
    x = rng.standard_normal((1, 12, 8))
    sizes = (2,) + (1,) * 10
    ours = decode(a, x, kv=StreamingKVCache(2, 4), sizes=sizes)
    assert rel_err(ours, decode(b, x, kv=StreamingKVCache(2, 4), sizes=sizes)) <= 1e-12


def test_a_row_blocked_everywhere_by_a_finite_minimum_is_what_the_lse_cannot_carry(rng):
    """finfo.min + log n rounds to finfo.min: every shard's lse is the same, the merge weighs the shards equally,
    where the unsplit softmax weighs every key equally (documented in kernels/split_kv.py). Shards of equal size
    agree; 2 + 1 keys do not. Rows with an allowed key are exact."""
    q, k, v = (rng.standard_normal((1, 1, n, 2)) for n in (2, 3, 3))
    mask = np.zeros((2, 3))
    mask[0] = np.finfo(np.float64).min  # query 0: every key blocked by a finite number
    whole, _ = kernels.VectorizedKernel().forward(q, k, v, mask)
    split, cache = SplitKVKernel(2).forward(q, k, v, mask)  # keys {0, 2} and {1}
    assert np.allclose(whole[0, 0, 0], v[0, 0].mean(axis=0))  # uniform over the 3 keys
    assert np.allclose(split[0, 0, 0], (v[0, 0, [0, 2]].mean(axis=0) + v[0, 0, 1]) / 2)  # uniform over the 2 shards
    assert rel_err(split[0, 0, 1], whole[0, 0, 1]) <= 1e-15


def test_bad_options_are_value_errors():
    for bad, match in [(dict(num_shards=0), "num_shards"), (dict(block=1.5), "block"), (dict(order="x"), "order"),
                       (dict(inner="fast"), "impl must be one of")]:  # fmt: skip
        with pytest.raises(ValueError, match=match):
            SplitKVKernel(**bad)
    q = np.zeros((1, 1, 2, 3))
    with pytest.raises(ValueError, match="mask with shape"):
        SplitKVKernel(2).forward(q, q, q, mask=np.ones((3, 3), bool))
