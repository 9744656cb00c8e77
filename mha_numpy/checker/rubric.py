"""The teacher's rubric for the prose parts of the exercise notebooks' inline questions.

Every "**Inline question N.**" of ``exercises/exNN_*.ipynb`` has a short form (``checker.short_answers``), a rubric
entry here under the same key ``"exNN.inline_N"``, or both: the form grades what has a definite answer (a number, a
shape, a choice), the rubric what is said in words (why). ``tests/test_short_answers.py`` walks the notebooks so
that a new question without either fails.

A ``Rubric`` is data the grader reads (``checker.written`` puts it beside the student's text in results.json, at 0
of its points for the teacher to grade) and ``docs/rubric.md`` renders (``markdown()``; a test keeps the page in
step). Each entry: ``asks``, the prose part in a few words; ``points``; ``full``, the key facts a full answer must
say (each worth about an equal share of the points); ``wrong``, the common wrong answers and what they earn.
The model answers, in full, are in ``exercises/solutions/answers.md``.
"""

from __future__ import annotations

from dataclasses import dataclass

from .short_answers import FORMS


@dataclass(frozen=True)
class Rubric:
    """What a full answer to the prose part of one inline question says, and what the usual wrong ones earn."""

    asks: str
    full: tuple[str, ...]
    wrong: tuple[tuple[str, float], ...] = ()  # (a common wrong answer, the points it earns)
    points: float = 2.0

    def text(self) -> str:
        """The rubric as plain text (the grader's output beside the student's answer)."""
        lines = [f"Rubric ({self.points:g} points): {self.asks}", "A full answer says:"]
        lines += [f"  - {fact}" for fact in self.full]
        if self.wrong:
            lines.append("Common wrong answers:")
            lines += [f"  - {answer} ({earns:g} of {self.points:g})" for answer, earns in self.wrong]
        return "\n".join(lines)


RUBRIC: dict[str, Rubric] = {
    "ex01.inline_1": Rubric(
        "why db is summed over both B and L",
        (
            "b is added to every row of every sentence: y[b, l] = x[b, l] Wᵀ + b, B·L uses of the same b",
            "each use contributes its upstream gradient, so db = Σ over b and l of dy[b, l], shape (out,)",
        ),
        (("'to get the right shape' with no reason", 0.5), ("sums over L only, or says the batch is averaged", 0)),
    ),
    "ex01.inline_2": Rubric(
        "why d_table[ids] += d_out is wrong with a repeated token, and what np.add.at does",
        (
            "fancy-indexed += is a read, an add and one buffered write per distinct index: a[[1, 1]] += 1 gives 1",
            "a token that occurs twice gets the gradient of one occurrence only",
            "np.add.at is unbuffered: it adds every occurrence",
        ),
        (("'it overwrites' without saying that repeated indices collapse", 1), ("'np.add.at is faster'", 0)),
        points=3.0,
    ),
    "ex02.inline_2": Rubric(
        "why the reshape-only split with its mirror backward passes finite differences",
        (
            "the reshape is linear and its mirror backward is its exact adjoint: the pair is consistent",
            "finite differences of this (wrong) forward therefore agree with this backward",
            "only a comparison of the forward with a reference (the library's, or torch) shows the wrong split",
        ),
        (("'the check is not precise enough'", 0), ("'because it has the right shape'", 0.5)),
        points=3.0,
    ),
    "ex03.inline_1": Rubric(
        "why 1/√d, and what the gradient of a nearly one-hot softmax is",
        (
            "q·k of d independent unit-variance terms has variance d: standard deviation √d (16 for d = 256)",
            "dividing by √d brings the spread back to 1 whatever the head size",
            "for a nearly one-hot p the Jacobian diag(p) − p pᵀ is ≈ 0: the gradient vanishes, learning stalls",
        ),
        (("'to normalise the scores' with no variance argument", 1), ("'the gradient explodes'", 0)),
        points=3.0,
    ),
    "ex03.inline_2": Rubric(
        "why an all-ones d_scores cannot catch dSᵀ K with Lq = Lk, and a random one does",
        (
            "with Lq = Lk an all-ones dS is symmetric: dSᵀ = dS, so dSᵀ K equals dS K exactly, for any inputs",
            "a random dS is not symmetric, so the transpose changes the result",
        ),
        (("'all-ones is too small a test' with no symmetry argument", 0.5),),
    ),
    "ex04.inline_1": Rubric(
        "why a mask backward that returns d_out unchanged is still a bug",
        (
            "it claims that a blocked score influenced the loss: the pair is wrong on its own",
            "it is hidden only by what follows (the softmax backward multiplies by p = 0); reused before anything "
            "else (an additive bias, another normaliser, a sparse kernel) the leak shows",
            "a unit check with a random upstream gradient catches it at once",
        ),
        (("'it is not a bug, the result is the same'", 0), ("'it is slower'", 0)),
        points=3.0,
    ),
    "ex04.inline_2": Rubric(
        "why the forward scales by 1/(1−p) during training",
        (
            "inverted dropout keeps the expected value of each output equal to its input during training",
            "so inference is the plain forward with nothing to rescale (the same weights with dropout on or off)",
        ),
        (("'to keep the gradients from vanishing'", 0),),
    ),
    "ex05.inline_1": Rubric(
        "why each row of the correct dx sums to 0",
        (
            "adding the same c to every score of a row leaves p unchanged: the derivative along (1, …, 1) is 0",
            "in formulas: Σ_i p_i (dp_i − Σ_j p_j dp_j) = Σ p dp − (Σ p)(Σ p dp) = 0 since Σ p = 1",
        ),
        (("'because the probabilities sum to 1' with no step to dx", 1),),
    ),
    "ex05.inline_2": Rubric(
        "why the upstream gradient of a check must be random, and what a wrong backward must return to pass",
        (
            "for dp = ones the correct backward returns exactly 0 (p ∘ (1 − 1)), and finite differences ≈ 0 too",
            "so a wrong backward passes if it returns anything ≈ 0 (several do)",
            "a random dp has no such symmetry: it tests every direction of the Jacobian at once",
        ),
        (("'random is more general' with nothing about the ones case", 0.5),),
        points=3.0,
    ),
    "ex06.inline_1": Rubric(
        "why W_o: what the model could not do if the concatenation were the output",
        (
            "without W_o each output feature comes from one head only (its block of d features)",
            "W_o mixes the heads, each output feature a learned combination of all heads, in the model's basis",
        ),
        (("'to get the shape back to E'", 0.5), ("'W_o adds non-linearity'", 0)),
    ),
    "ex06.inline_2": Rubric(
        "why db_k is exactly 0 in theory",
        (
            "b_k adds the same vector to every key: s_ij changes by α q_i·b_k, the same for every j of row i",
            "softmax ignores a shift common to a row, so the loss does not depend on b_k: its gradient is 0 "
            "(≈ 1e-17 of rounding in float64)",
        ),
        (("'b_k is initialised to 0'", 0), ("'the same holds for b_q'", 1)),
    ),
    "ex06.inline_3": Rubric(
        "which finite-difference check catches a dx with the query path only",
        (
            "finite differences on x perturb x everywhere it is used, so they see all three paths",
            "the missing key and value paths make an error of the order of the gradient itself",
        ),
        (("'none: finite differences cannot see it'", 0),),
    ),
    "ex07.inline_1": Rubric(
        "why (m, ℓ, a) per query is enough",
        (
            "the context is Σ_j e^(s_j − m) v_j / Σ_j e^(s_j − m) for any m",
            "rescaling ℓ and a together by e^(m_old − m_new) when m changes gives exactly that ratio at the end",
            "(the backward keeps m and 1/ℓ apart, not m + log ℓ: the lse loses log ℓ's digits when |m| is large)",
        ),
        (("'only the maximum matters'", 0.5),),
        points=3.0,
    ),
    "ex07.inline_2": Rubric(
        "what the update should do when m_new is −∞",
        (
            "exp(−∞ − (−∞)) is NaN, and NaN · 0 is NaN: the row is poisoned for good",
            "while m is −∞ nothing has been accumulated (ℓ = 0, a = 0), so any finite shift is right: use 0 where "
            "m_new is not finite",
        ),
        (("'skip the row'", 0.5), ("'add a small epsilon'", 0.5)),
    ),
    "ex08.inline_1": Rubric(
        "why dx has two mean terms",
        (
            "x̂ does not change when x is shifted (x + c·1) or scaled about its mean",
            "the backward removes from g = dy ∘ γ its component along 1 (the mean(g) term) and along x̂ (the "
            "x̂ · mean(g ∘ x̂) term), then divides by the standard deviation",
        ),
        (("'one for the mean, one for the variance' with no direction argument", 1),),
    ),
    "ex09.inline_1": Rubric(
        "which rows are exact and why a correct backward is not bit-for-bit the library's",
        (
            "exact rows are rare (the first gradient already differs in its last bits when computed in another "
            "order); rows are approximate, at ~1e-17 of the largest gradient",
            "floating-point addition is not associative: d_x adds four paths, and the sum depends on their order",
            "exactness is not the test; agreement to 1e-6 of the largest gradient is",
        ),
        (("'the library has a bug' or 'mine is more precise'", 0), ("'rounding' with no word on the order", 1)),
        points=3.0,
    ),
    "ex09.inline_2": Rubric(
        "why d_logits and d_scores each sum to 0 along one axis",
        (
            "d_logits = (p − onehot)/N: each row of p sums to 1 and the one-hot to 1",
            "softmax ignores a constant added to a row of scores, so d_scores has no component along (1, …, 1): it "
            "sums to 0 over the keys",
        ),
        (("'because softmax sums to 1' with no step to the gradient", 1),),
    ),
    "ex09.inline_3": Rubric(
        "what d_tok_emb[tokens] = d_tok gets wrong",
        (
            "a token that occurs more than once gets one of its gradients: the assignment (and += on fancy "
            "indexing) keeps one write per distinct token",
            "np.add.at adds them all; d_pos_emb sums over the batch (every sequence uses row i)",
        ),
        (("'it is slower'", 0),),
    ),
    "ex10.inline_1": Rubric(
        "where exactness stops in the table",
        (
            "from d_y down to the second linear the gradients can be exact: the same arithmetic as the library",
            "exactness stops at the first line whose backward is written in another order (the GELU derivative) "
            "or sums two paths or over an axis; after it, rows are exact only by chance",
            "everything stays approximate (~1e-15): that is the test",
        ),
        (("'all rows exact'", 0), ("'no row can be exact'", 1)),
        points=3.0,
    ),
    "ex10.inline_2": Rubric(
        "why the norm's part of d_h sums to 0 and is almost orthogonal to xhat2",
        (
            "the numbers measured with the student's own function (a row sum ≈ 1e-16, a small dot product)",
            "x̂₂ does not change when h shifts by c·1: the norm's part of d_h has no component along 1",
            "scaling h about its mean leaves x̂₂ unchanged only when eps = 0: then the part is orthogonal to x̂₂; "
            "with eps > 0 the dot product is small, not 0",
        ),
        (("the facts without numbers from the student's function", 2), ("'because LayerNorm normalises'", 0.5)),
        points=3.0,
    ),
    "ex10.inline_3": Rubric(
        "which gradients of a post-norm block collect two paths",
        (
            "x collects the skip of x + a and the attention paths; h collects the skip of h + f and the "
            "feed-forward path",
            "d_y passes LN2's backward (to d(h + f)) before it splits; d_h then passes LN1's before d_x and d_a",
        ),
        (("'the same as pre-norm'", 0),),
    ),
    "ex11.inline_1": Rubric(
        "why each 2×2 block's transpose is its inverse, and why a size check cannot catch the wrong turn",
        (
            "R(φ) has orthonormal columns: R(φ)ᵀ R(φ) = I, and R(φ)ᵀ = R(−φ): the backward turns by −φ",
            "a rotation keeps lengths: each pair of dx has the norm of the same pair of d_out",
            "that holds for a backward that turns by +φ too; only the values (the direction) tell them apart, and "
            "at position 0 (φ = 0) nothing does",
        ),
        (("'because cos² + sin² = 1' alone", 1),),
        points=3.0,
    ),
    "ex11.inline_2": Rubric(
        "which wrong repeat_kv_backward gives exactly the right answer with an all-ones gradient",
        (
            "every query head of a group gets the same g, so the right sum is n_rep · g",
            "n_rep * d_out[:, ::n_rep] gives exactly that, and so does the sum in np.tile's grouping",
            "the mean gives g, not n_rep · g, and still shows; a random gradient shows all three",
        ),
        (("names the mean as the one that passes", 0),),
        points=3.0,
    ),
    "ex12.inline_1": Rubric(
        "what d_table[:, idx] += d gives for the most-read column",
        (
            "NumPy buffers the fancy-indexed add: one of the column's writes is kept",
            "the column gets one gradient instead of the sum of ten; np.add.at accumulates them all",
        ),
        (("'it is slower'", 0), ("'an index error'", 0)),
    ),
    "ex12.inline_2": Rubric(
        "why the checker scales its test scores by 3",
        (
            "the two backwards differ by d_out · tanh²(s / cap): tiny for small scores, tens of percent at s ~ 1",
            "scaling by 3 puts many scores in the flat part of the tanh, where the correct gradient nearly "
            "vanishes and a forgotten tanh' is most visible",
        ),
        (("'to test large numbers' with no tanh argument", 0.5),),
    ),
    "ex13.inline_1": Rubric(
        "the identity Σ_k P dP = Σ_c dO O, and why D from one tile is wrong",
        (
            "dP = dO Vᵀ, so Σ_k P_ik dP_ik = Σ_c dO_ic Σ_k P_ik V_kc = Σ_c dO_ic O_ic",
            "the softmax VJP's row term is that sum over all the keys of the row",
            "rowsum(P_j ∘ dP_j) of one tile is only the part of its keys: dS_j is wrong in every tile (its rows "
            "no longer sum to 0), though the shape is right",
        ),
        (("the identity without the reason a tile's sum is wrong", 1), ("'a tile is not normalised'", 0.5)),
        points=3.0,
    ),
    "ex13.inline_2": Rubric(
        "what the backward stores per query",
        (
            "m and 1/ℓ per query and head (two numbers), plus O, which the forward returns anyway",
            "D = rowsum(dO ∘ O) is computed once at the start of the backward, Lq numbers, not stored by the forward",
        ),
        (("'the weights of one tile'", 0),),
    ),
    "ex14.inline_1": Rubric(
        "why q̄_t is the only gradient of token t that does not depend on later tokens",
        (
            "q_t only reads (R4): nothing after t uses it, so dq_t = S_t do_t needs the forward's S_t and this "
            "token's do_t only",
            "k_t, v_t, β_t, g_t write into the state that later tokens read, so their gradients need the carried S̄",
            "at the last token S̄ = q do ᵀ carried or not (the final state is not an output)",
        ),
        (("'because q is the query' with no read/write argument", 0.5),),
        points=3.0,
    ),
    "ex14.inline_2": Rubric(
        "why the side of the write on which the backward applies a_t matters",
        (
            "the erasure commutes with a scalar a_t, the write does not: β_t k_t v_tᵀ (the new content) is not decayed",
            "dv_t, dβ_t, dk_t (and dg_t) come from S̄, the gradient of S_t, undecayed; multiplied first they are "
            "a_t times too large",
            "dq_t and the gradient carried to S_{t−1}, a_t (S̄ − k_t du_tᵀ), are the same either way",
        ),
        (("'it does not matter, they commute'", 0),),
        points=3.0,
    ),
    "ex14.inline_3": Rubric(
        "what changes in ← R1 with one decay per key channel",
        (
            "← R1 becomes S̄ ← Diag(a_t) S̃̄: the rows of the gradient, one per key channel, scaled by a_t",
            "ḡ_t = a_t ∘ Σ_v (S̃̄ ∘ S_{t−1}), summed over the value axis only (the scalar gate sums over both)",
            "R2–R4 and their backward do not change",
        ),
        (("'everything changes'", 0), ("the shape without the sum over the value axis", 1)),
        points=3.0,
    ),
    "ex15.inline_1": Rubric(
        "why block i's x gradient is block i − 1's d_y, and why the calls go last block first",
        (
            "block i's input x is block i − 1's output y: the same array, so ∂loss/∂x of block i is the d_y block "
            "i − 1 needs",
            "the chain rule runs from the loss back: block i's backward needs its d_y, which only block i + 1's "
            "backward (or the head) produces, so the last block goes first",
        ),
        (("'that is the convention'", 0),),
    ),
}


def markdown() -> str:
    """docs/rubric.md: every inline question's short form and rubric, by exercise (``tests`` keep it current)."""
    lines = [
        "# Rubric for the inline questions (for teachers)",
        "",
        "Generated from `mha_numpy/checker/short_answers.py` and `mha_numpy/checker/rubric.py` by",
        "`python -m mha_numpy.checker.rubric > docs/rubric.md`; do not edit by hand. The teacher's mode",
        "(`python -m mha_numpy check --submit hand_in.ipynb`, [course.md](course.md#for-teachers)) grades each short",
        "answer and lists each written answer at 0 of its points, with this rubric beside it, for you to grade.",
        "The model answers in full: `exercises/solutions/answers.md` (not in the students' copy).",
    ]
    keys = sorted(set(RUBRIC) | set(FORMS), key=lambda k: (k.split(".")[0], int(k.rsplit("_", 1)[1])))
    exercise = ""
    for key in keys:
        if key.split(".")[0] != exercise:
            exercise = key.split(".")[0]
            lines += ["", f"## Exercise {int(exercise[2:])}"]
        lines += ["", f"### {key}", ""]
        if key in FORMS:
            lines.append(f"- **Short answer** ({FORMS[key].points:g} point, graded automatically): {FORMS[key].says}.")
        if key in RUBRIC:
            r = RUBRIC[key]
            lines.append(f"- **Written** ({r.points:g} points, graded by you): {r.asks}. A full answer says:")
            lines += [f"    - {fact}" for fact in r.full]
            if r.wrong:
                lines.append("- **Common wrong answers:** " + "; ".join(f"{a} ({e:g})" for a, e in r.wrong) + ".")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
