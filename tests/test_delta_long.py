"""The chunked gated delta rule at long L (issue 37): its threads (the B·H sequences in bands, one per thread BLAS
may use) and its memory at L = 65536, linear in L with no (L, L) array (tracemalloc)."""

from __future__ import annotations

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

from mha_numpy import threads
from mha_numpy.recurrent import delta_chunked, gated_delta_rule_backward, gated_delta_rule_forward


def make(B, Hk, H, L, dk, dv, per_channel=False, dtype=np.float64, seed=0):
    rng = np.random.default_rng(seed)
    x = {
        "q": rng.standard_normal((B, Hk, L, dk)),
        "k": rng.standard_normal((B, Hk, L, dk)) / np.sqrt(dk),
        "v": rng.standard_normal((B, H, L, dv)),
        "g": -rng.uniform(0.05, 0.6, (B, H, L, dk) if per_channel else (B, H, L)),
        "beta": rng.uniform(0.1, 0.9, (B, H, L)),
        "initial_state": rng.standard_normal((B, H, dk, dv)),
    }
    return {n: a.astype(dtype) for n, a in x.items()}


def forward_backward(x, seed=1, **kw):
    (o, S), cache = gated_delta_rule_forward(**x, **kw)
    rng = np.random.default_rng(seed)
    d_o, d_S = rng.standard_normal(o.shape).astype(o.dtype), rng.standard_normal(S.shape).astype(S.dtype)
    return o, S, gated_delta_rule_backward(d_o, cache, d_S)


def test_the_bands_follow_blas_threads_and_stop_at_one_inside_the_pool():
    with threadpool_limits(limits=2, user_api="blas"):
        assert threads.blas_threads() == 2
        assert delta_chunked.head_bands(5) == [slice(0, 2), slice(2, 5)]
        assert delta_chunked.head_bands(1) == [slice(0, 1)]
        with threads.blas_single_threaded():  # a pool item: no band split inside it
            assert delta_chunked.head_bands(5) == [slice(0, 5)]
    with threadpool_limits(limits=1, user_api="blas"):
        assert delta_chunked.head_bands(5) == [slice(0, 5)]


@pytest.mark.parametrize("per_channel", [False, True])
def test_bands_give_the_same_numbers_as_one_band(per_channel):
    """B = 2, H = 3 (grouped: Hk = 1): two bands of three sequences, cutting across the batch, against one band;
    equal to the last bit (each sequence's arithmetic is the same in any band)."""
    x = make(2, 1, 3, 21, 4, 5, per_channel=per_channel, seed=3)
    with threadpool_limits(limits=1, user_api="blas"):
        one = forward_backward(x, chunk_size=4, use_qk_l2norm=True)
    with threadpool_limits(limits=2, user_api="blas"):
        two = forward_backward(x, chunk_size=4, use_qk_l2norm=True)
    for a, b in zip(one[:2], two[:2], strict=True):
        np.testing.assert_array_equal(a, b)
    for name, grad in one[2].items():
        np.testing.assert_array_equal(grad, two[2][name], err_msg=name)


def traced_peak(L: int, d: int = 16) -> int:
    """tracemalloc's peak over one chunked forward + backward (chunks of 64) at B = H = 1, d_k = d_v = d, float64:
    NumPy's allocations, the cache and the outputs included, the inputs (made before) not."""
    import tracemalloc

    x = make(1, 1, 1, L, d, d, seed=2)
    tracemalloc.start()
    try:
        forward_backward(x, chunk_size=64)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_memory_at_L_65536_is_linear_in_L_with_no_L_by_L_array():
    """What grows with L is a few (L, d) arrays and, per chunk of C tokens, the (C, C) matrices T and P and a
    (d, d) state: O(L·(d + C) + H·d²) floats, O(L·d) at Qwen3-Next's C = 64 ≤ d = 128. Here d = 16 < C, so both
    terms count. From L = 16384 to 65536 each further token costs under 6 float64 per unit of d + C (measured 3.7:
    61 -> 172 MiB; the blocks' temporaries are a constant), the peak at 65536 is under 6 such floats a token too
    (4.4), it grows no faster than L, and it is a fraction of one (L, L) float64 array (32 GiB)."""
    d, C, L = 16, 64, 65536
    small, large = traced_peak(L // 4, d), traced_peak(L, d)
    per_token = (large - small) / (L - L // 4)
    assert per_token < 6 * 8 * (d + C), per_token
    assert large < 6 * 8 * L * (d + C) + 8 * d * d, large
    assert large < 4 * small, (small, large)  # linear or slower: an L² term would multiply it by 16
    assert large < L * L * 8 / 100, large
