"""Model answers to the exercises at the end of the notebooks (``mha_numpy.checker.answers``), derived by hand.

``SOLUTIONS[key]`` is the answer a student would paste into the notebook's ``answer = None`` line; ``MISTAKES[key]``
is a typical wrong answer (the diagonal shortcut, a forgotten scale, the wrong convention), which the check must reject.
``tests/test_notebook_exercises.py`` checks both. A teacher who hands out the notebooks leaves this file out.
"""

import numpy as np


def _softmax(x):
    e = np.exp(np.asarray(x, dtype=float) - np.max(x))
    return e / e.sum()


_s01 = np.array([1.0, 2.0, 3.0]) / np.sqrt(2)  # q·k_j = 1, 2, 3, divided by √d = √2
_p03 = _softmax([1.0, 2.0, 0.0])
_dp03 = np.array([1.0, -1.0, 2.0])
_x03 = np.array([[1.0, 2.0], [0.0, 1.0], [3.0, -1.0]])
_dy03 = np.array([[1.0, 0.0], [0.0, 2.0], [-1.0, 2.0]])
_phi1 = np.exp(-0.5) / np.sqrt(2 * np.pi)  # the standard normal density at 1
_Phi1 = 0.8413447460685429  # the standard normal CDF at 1, Φ(1) = (1 + erf(1/√2)) / 2


def _dropout_backward(d_out, cache):
    """The fix of notebook 10's exercise: the backward multiplies by the same keep_mask / (1 - p) as the forward."""
    if cache is None:  # p = 0: the forward returned x itself
        return d_out
    keep_mask, scale = cache  # scale = 1 / (1 - p)
    return d_out * keep_mask * scale


SOLUTIONS = {
    "01.scores": _s01,
    "01.weights": _softmax(_s01),
    "01.context": _softmax(_s01) @ np.array([[1.0, 0.0], [0.0, 1.0], [2.0, 2.0]]),
    "02.causal_mask": np.tril(np.ones((4, 4), dtype=bool)),
    "02.padding_mask": np.array([[True, True, True], [True, False, False]]),
    "02.masked_rows": np.array([[1.0, 0.0, 0.0], [0.0, 0.0, 0.0]]),
    "03.softmax_jacobian": np.diag(_p03) - np.outer(_p03, _p03),
    "03.softmax_vjp": _p03 * (_dp03 - _p03 @ _dp03),
    "03.linear_dW": _dy03.T @ _x03,
    "04.key_padding_mask": np.array([[False, False, True], [False, True, True]]),
    "04.in_proj_rows": (8, 12),
    "05.score_bytes": 12 * 4096**2 * 8,  # 1.6 GB for one layer's scores
    "05.online_softmax": [5.0, np.exp(-4.0) + np.exp(-2.0) + np.exp(-3.0) + 1.0],
    "05.causal_tiles": 10,  # 4 + 3 + 2 + 1 tiles on and below the diagonal of a 4 × 4 grid
    "06.moved": [0.09, 0.2],
    "06.entropy": 0.5,  # log 2 / log 4
    "07.ce_grad": _softmax([2.0, 1.0, 0.0]) - np.array([1.0, 0.0, 0.0]),
    "07.reverse_map": np.fliplr(np.eye(4)),
    "08.residual": np.array([1.0, -1.0]) + np.array([1.0, -1.0]) @ np.array([[1.0, 2.0], [0.0, 1.0]]),
    "08.gelu_slope": [0.5, _Phi1 + 1.0 * _phi1],
    "08.layer_norm_sums": [0.0, 0.0],
    "09.repeat_kv": [3.0, 7.0],
    "09.rope_score": 0.5,  # cos(2 · π/6)
    "09.alibi": [-1.5, -1.0, -0.5, 0.0],
    "10.blind_check": "finite differences",
    "10.ones_dx": [0.0, 0.0, 0.0],
    "10.dropout_backward": _dropout_backward,
    "11.soft_cap": 30 * np.tanh(np.array([10.0, 100.0]) / 30),
    "11.soft_cap_grad": 1 - np.tanh(np.array([10.0, 100.0]) / 30) ** 2,
    "11.sink": [1 / 3, 1 / 3],
    "11.keys_seen": [6, 7, 8],  # query i is the token at position 5 + i: keys 0 ... 5 + i
    "00.nw_weights": _softmax([-0.5, 0.0, -2.0]),  # −(0 − x)² / 2 for x = −1, 0, 2
    "00.score_variance": 64 * 2.0**2,  # d terms, each of variance v · v
    "12.merge_context": np.array([2.0, 6.0]) / 8.0,  # weights e^lse_s / (2 + 6) on [1, 0] and [0, 1]
    "12.merge_lse": np.log(8.0),
    "12.ring_work": [[1 + 2 + 3 + 4, 5 + 6 + 7 + 8, 9 + 10 + 11 + 12], [26, 26, 26]],  # zigzag: 78 / 3 each
    "13.cache_rows": (5, 8),
    "13.memory_grad_terms": 4,
    "14.rel_bias_columns": [0, 6],  # clip(1 − 5) + 3 = −3 + 3, clip(6 − 0) + 3 = 3 + 3
    "14.abs_complex_step": [0.0, -1.0],  # |−1.5 + iε| is real: no imaginary part; |s| = −s there
    "14.document_blocks": (4, 7, 5),  # a 4 × 4 grid; the edge between the documents at 3 cuts block row and column 1
    "15.half_step": [0.25, 0.5],  # S_1 = ½ k v_1ᵀ; u_2 = v_2 − ½ v_1; S_2ᵀk = ½ v_1 + ½ (v_2 − ½ v_1) = ¼ v_1 + ½ v_2
    "15.decay_entry": np.exp(-1.5),  # orthonormal keys: no correction; decayed by g_2, g_3, g_4 (not g_1)
    # S: Hv·dk·dv = 32·128·128 = 524288; conv: (K − 1)·(2·Hk·dk + Hv·dv) = 3·(4096 + 4096) = 24576
    "15.state_floats": 32 * 128 * 128 + 3 * (2 * 16 * 128 + 32 * 128),
    "16.interleave_order": [0, 2, 4, 6, 1, 3, 5, 7],  # half-split pair i = (i, i + 4) must hold x's (2i, 2i + 1)
    "16.yarn_scores": [0.1 * np.log(16) + 1, (0.1 * np.log(16) + 1) ** 2],  # q and k each times f: q·k times f²
    # λ_i = 2π · 500000^(i/64): λ < 2048 for i ≤ 28 (λ_28 = 1956, λ_29 = 2402); λ > 8192 for i ≥ 35 (λ_34 = 6695,
    # λ_35 = 8219)
    "16.llama3_pairs": (29, 6, 29),
    "16.chunk_pairs": 6 + 6 + 3,  # chunks of 3, 3 and 2 positions, each causal: 3·4/2 + 3·4/2 + 2·3/2
    "17.topk_keys": [0, 2],  # keys 5, 6 masked; of 0 ... 4 the best score 3 is held by 0, 2, 4: the lower two
    "17.loss_grad": np.array([0.25, 0.25, 0.5]) - np.array([0.5, 0.5, 0.0]),  # softmax(I) = [1/4, 1/4, 1/2], Σp = 1
    "17.selected_scores": 1 + 2 + 6 * 3,  # queries 0 and 1 have 1 and 2 keys; the other six fill their 3 slots
    "18.decay_entry": np.exp(-0.5 * (0.5 + 1.0)),  # a_2 + a_3: the tokens after 1 up to 3, not a_1 itself
    "18.block_rank": 3,  # ≤ N: chunk 0 reaches chunk 2 only through the (N, P) state; = N for random B, C
    "18.state_bytes": 8 * (4 * 16 * 32 + 3 * (4 * 32 + 2 * 16)),  # S: H·N·P = 2048; conv: (K − 1)·(I + 2·G·N) = 480
}

MISTAKES = {
    "01.scores": np.array([1.0, 2.0, 3.0]),  # the 1/√d forgotten
    "01.weights": np.array([1.0, 2.0, 3.0]) / 6,  # normalised without the exp
    "01.context": np.array([1.0, 1.0]),
    "02.causal_mask": np.triu(np.ones((4, 4), dtype=bool)),  # the future instead of the past
    "02.padding_mask": np.array([[1, 1, 1], [1, 0, 0]]),  # HF's 1/0, not bool
    "02.masked_rows": np.array([[1.0, 0.0, 0.0], [np.nan, np.nan, np.nan]]),  # what a naive softmax gives
    "03.softmax_jacobian": np.diag(_p03 * (1 - _p03)),  # the diagonal shortcut
    "03.softmax_vjp": _p03 * (1 - _p03) * _dp03,
    "03.linear_dW": _x03.T @ _dy03,  # the swapped transpose, (in, out)
    "04.key_padding_mask": np.array([[True, True, False], [True, False, False]]),  # our convention passed as is
    "04.in_proj_rows": (4, 8),  # the rows of W_k
    "05.score_bytes": 12 * 4096**2 * 4,  # float32's bytes
    "05.online_softmax": [5.0, np.exp(-2.0) + 1.0 + np.exp(-3.0) + 1.0],  # the first block not rescaled
    "05.causal_tiles": 16,
    "06.moved": [0.9, 0.1],  # the weights alone
    "06.entropy": np.log(2),  # not normalised
    "07.ce_grad": _softmax([2.0, 1.0, 0.0]),
    "07.reverse_map": np.eye(4),  # the copy task's map
    "08.residual": np.array([1.0, -1.0]) @ np.array([[1.0, 2.0], [0.0, 1.0]]),  # the skip path forgotten
    "08.gelu_slope": [0.5, _Phi1],  # the x φ(x) term forgotten
    "08.layer_norm_sums": [0.0, 1.0],
    "09.repeat_kv": [1.0, 3.0],  # one head of each group, not the sum
    "09.rope_score": np.cos(4 * np.pi / 6),  # (i + j)·θ
    "09.alibi": [1.5, 1.0, 0.5, 0.0],  # a reward for distance
    "10.blind_check": "a reference pair",
    "10.ones_dx": [1.0, 1.0, 1.0],
    "10.dropout_backward": lambda d_out, cache: d_out if cache is None else d_out * cache[0],  # no 1/(1 - p)
    "11.soft_cap": np.minimum(np.array([10.0, 100.0]), 30.0),  # a hard clip
    "11.soft_cap_grad": [1.0, 0.0],
    "11.sink": [0.5, 0.5],  # the plain softmax
    "11.keys_seen": [1, 2, 3],  # top-left: the first new token sees key 0 only
    "00.nw_weights": [1 / 3, 1 / 3, 1 / 3],  # a softmax of q·x = 0 for q = 0
    "00.score_variance": 64 * 2.0,  # d · v: the variance of one factor, not of the product
    "12.merge_context": [0.5, 0.5],  # the plain average of the two contexts
    "12.merge_lse": np.log(6.0),  # the larger partial's lse
    "12.ring_work": [[16, 32, 48], [26, 26, 26]],  # the diagonal block counted in full, as if unmasked
    "13.cache_rows": (5, 5),  # the cross-attention keys taken for the decoder's own
    "13.memory_grad_terms": 2,  # one per layer: the value path forgotten
    "14.rel_bias_columns": [6, 0],  # the distance i − j instead of j − i
    "14.abs_complex_step": [-1.0, -1.0],  # trusting the complex step through np.abs
    "14.document_blocks": (4, 0, 12),  # every block with an allowed entry taken for full
    "15.half_step": [0.5, 0.5],  # linear attention's sum of β-weighted writes: the correction forgotten
    "15.decay_entry": np.exp(-2.0),  # token 1's write decayed by its own g_1 too
    "15.state_floats": 32 * 128 * 128,  # S only: the conv's state forgotten
    "16.interleave_order": [0, 4, 1, 5, 2, 6, 3, 7],  # the inverse permutation: half-split back to interleaved
    "16.yarn_scores": [0.1 * np.log(16) + 1, 0.1 * np.log(16) + 1],  # the factor counted once, on q or on k
    "16.llama3_pairs": (35, 0, 29),  # every pair with λ < N taken as kept
    "16.chunk_pairs": 9 + 9 + 4,  # the chunks' whole blocks: the causal mask inside forgotten
    "17.topk_keys": [5, 6],  # the highest scores, but the mask blocks them
    "17.loss_grad": np.array([0.5, 0.5, 0.0]) - np.array([0.25, 0.25, 0.5]),  # p − softmax(I): the sign flipped
    "17.selected_scores": 8 * 3,  # L · k: the -1 slots of the first queries counted
    "18.decay_entry": np.exp(-0.5 * (2.0 + 0.5 + 1.0)),  # token 1's write decayed by its own a_1 too
    "18.block_rank": 8,  # the chunk's size taken for the rank
    "18.state_bytes": 8 * 4 * 16 * 32,  # S only: the conv's state forgotten
}
