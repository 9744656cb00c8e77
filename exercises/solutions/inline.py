"""Model answers to the short parts of the exercises' inline questions (``mha_numpy.checker.short_answers``), derived
by hand and written as a student writes them on the form's line (values, not code).

``SOLUTIONS[key]`` is the right answer; ``MISTAKES[key]`` a typical wrong one (the wrong axis, the buffered add, the
decay on the wrong side), which the check must reject. ``tests/test_short_answers.py`` checks both. The written
parts' model answers are in ``answers.md``. A teacher who hands out the notebooks leaves this folder out.
"""

SOLUTIONS = {
    "ex01.inline_1": (5, 3),  # the batch summed away: (L, out)
    "ex01.inline_2": [0.0, 1.0, 0.0],  # one buffered write to a[1]
    "ex02.inline_1": [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 1)],  # token 0 whole, half of token 1
    "ex02.inline_2": "a comparison with a reference forward",
    "ex03.inline_1": "nearly one-hot",  # gaps of ~16 become factors of e^16
    "ex04.inline_2": [4 / 3, 0.0, 4 / 3],  # keep / (1 − p) with p = 1/4
    "ex05.inline_1": "no",  # Σ p_i (1 − p_i) dp_i has no reason to vanish
    "ex05.inline_2": [0.0, 0.0, 0.0],  # p ∘ (1 − Σ p) = 0
    "ex06.inline_2": "absolute, against the largest gradient",
    "ex06.inline_3": "of the order of the gradient",
    "ex07.inline_1": "m and 1/l",
    "ex07.inline_2": "nan",  # −∞ − (−∞) is NaN
    "ex08.inline_1": 0.0,
    "ex09.inline_2": "scores",  # over the keys
    "ex09.inline_3": [0, 1, 3, 4, 6, 7],  # every row but 2 and 5
    "ex10.inline_3": "LN2",
    "ex11.inline_1": 1.0,  # a rotation keeps lengths
    "ex11.inline_2": "the mean over the group",  # g where the sum is n_rep · g; the other two give n_rep · g
    "ex12.inline_1": (4, 10),  # column clip(+2) + 2 = 4, read by every j − i ≥ 2: 4 + 3 + 2 + 1
    "ex12.inline_2": 0.002,  # tanh²(s/2) ≤ 1e-6 ⇔ |s| ≤ 2 atanh(1e-3) ≈ 2.000000667e-3
    "ex12.inline_3": [0.0, 0.0, 0.0, 0.0],  # p = 0, so D = 0, dx = p ∘ (dp − D) = 0, d_sink = −p_sink D = 0
    "ex13.inline_2": (4 * 16384 * 16384 * 4, 2 * 4 * 16384 * 4),  # 4 GiB against 512 KiB
    "ex14.inline_1": ["dq", "dk", "dv", "dg", "dbeta"],  # at the last token the carried S̄ is q do ᵀ either way
    "ex14.inline_2": ["dk", "dv", "dbeta", "dg"],  # the write's gradients, a_t times too large
    "ex14.inline_3": (1, 2, 5, 3),  # (B, H, L, dk): one per key channel
}

MISTAKES = {
    "ex01.inline_1": (3,),  # the shape of db, not of dy.sum(axis=0)
    "ex01.inline_2": [0.0, 2.0, 0.0],  # np.add.at's result
    "ex02.inline_1": [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1)],  # the right split's head 0
    "ex02.inline_2": "finite differences",
    "ex03.inline_1": "nearly uniform",
    "ex04.inline_2": [0.75, 0.0, 0.75],  # (1 − p), the test-time scaling
    "ex05.inline_1": "yes",
    "ex05.inline_2": [0.1848, 0.2227, 0.0819],  # the diagonal shortcut p(1 − p) for x = [1, 2, 0]
    "ex06.inline_2": "relative to its own size",
    "ex06.inline_3": "small, about 1e-6",
    "ex07.inline_1": "the log-sum-exp m + log l",
    "ex07.inline_2": "1",
    "ex08.inline_1": 1.0,
    "ex09.inline_2": "weights",
    "ex09.inline_3": [2, 5],  # the rows that were looked up
    "ex10.inline_3": "LN1",
    "ex11.inline_1": 0.5,
    "ex11.inline_2": "n_rep * d_out[:, ::n_rep]",
    "ex12.inline_1": (2, 4),  # the diagonal's column
    "ex12.inline_2": 2e-6,  # tanh(s/2) ≤ 1e-6 instead of tanh² (and the cap forgotten)
    "ex12.inline_3": [0.0, 0.0, 0.0, -1.0],  # −p_sink, as if D were 1
    "ex13.inline_2": (8 * 16384 * 16384 * 4, 2 * 4 * 16384 * 8),  # float64's 8 bytes
    "ex14.inline_1": ["dq"],
    "ex14.inline_2": ["dk", "dv", "dbeta", "dg", "dS0"],  # the carried gradient is the same either way
    "ex14.inline_3": (1, 2, 5),  # the scalar gate's shape
}
