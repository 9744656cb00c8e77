"""The final project (exercise 15): a GPT trained with the student's own block backward, graded stage by stage.

The model is GPT-2's shape built from exercise 10's block (``capstone_block.block_forward`` with causal attention):

    x = tok_emb[ids] + pos_emb[positions]            (B, L, E)                                        G1
    for each of the N blocks: x = block(x)           (B, L, E)  exercise 10's pre-norm block, causal    G2
    n = layer_norm(x) * gamma_f + beta_f             (B, L, E)                                        G3
    logits = n @ W_head.T                            (B, L, V)                                        G4
    loss = mean(-log softmax(logits)[next byte])     ()                                               G5

The backward of G5, G4, G3 and G1 is the library's; G2's is the student's ``capstone_block_backward(cache)``, called
once per block, last block first, with ``cache["d_y"]`` set to the gradient arriving from above (the block's
"loss" is sum(y * d_y), so its d_x is exactly what the block below needs). The stages, each stopping the grading:

    1. block      exercise 10's comparison (every intermediate, the first wrong one, the catalogued bug)
    2. causal     the same comparison on the causal block the GPT uses (masked scores are -1e30, their weights
                  exactly 0: a backward that reads the cached weights needs no change)
    3. step       one training step of a two-block GPT from the same weights and batch, student's backward against
                  the library's: every parameter's gradient (the first that differs is named, with its layer), then
                  the parameters after the Adam step
    4. loss       training with the student's backward reaches the stated validation loss (``train``)

``python -m mha_numpy check --gpt`` grades a file (or ``check_namespace(..., gpt=...)`` a notebook) through these
stages and one more before them, the file's own pairs, with stage 4 run where the student's code runs
(``checker.gpt_stages``, ``checker.gpt_child``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np

from .. import functional as F
from ..models import layers as LY
from ..optim import Adam, clip_grad_norm
from ..threads import blas_single_threaded
from . import capstone as C
from . import capstone_block as CB
from . import gpt_child as GC

EPS = CB.EPS


@dataclass(frozen=True)
class GPTSizes:
    """V bytes, context L, width E, N blocks, H heads, feed-forward I (exercise 10's block: I = 4E is GPT-2's)."""

    vocab_size: int = 256
    context: int = 64
    hidden: int = 128
    layers: int = 3
    heads: int = 4
    inner: int = 512


def gpt_params(s: GPTSizes, seed: int = 0) -> dict:
    """GPT-2's initialisation, scaled for a small model: N(0, 0.02²) weights, zero biases, unit norms; by name."""
    rng = np.random.default_rng(seed)
    P = {
        "tok_emb": rng.normal(0, 0.02, (s.vocab_size, s.hidden)),
        "pos_emb": rng.normal(0, 0.01, (s.context, s.hidden)),
    }
    for i in range(s.layers):
        block = {n: rng.normal(0, 0.02, shape) for n, shape in (
            ("W_q", (s.hidden, s.hidden)), ("W_k", (s.hidden, s.hidden)), ("W_v", (s.hidden, s.hidden)),
            ("W_o", (s.hidden, s.hidden)), ("W_1", (s.inner, s.hidden)), ("W_2", (s.hidden, s.inner)))}  # fmt: skip
        block.update({n: np.zeros(s.hidden) for n in ("b_q", "b_k", "b_v", "b_o", "b_2", "beta1", "beta2")})
        block.update(b_1=np.zeros(s.inner), gamma1=np.ones(s.hidden), gamma2=np.ones(s.hidden))
        P.update({f"layers.{i}.{n}": block[n] for n in CB.PARAMS})
    P.update(gamma_f=np.ones(s.hidden), beta_f=np.zeros(s.hidden), W_head=rng.normal(0, 0.02, (s.vocab_size, s.hidden)))
    return P


def loss_and_grads(P: dict, ids: np.ndarray, s: GPTSizes, block_backward: Callable | None) -> tuple[float, dict]:
    """ids (B, L + 1) -> (loss, gradients by name): G1-G5 forward, then the backward with ``block_backward(cache)``
    for every block (None: the library's reference, ``capstone_block.block_reference``)."""
    x_ids, y_ids = ids[:, :-1], ids[:, 1:]  # (B, L) each
    B, L = x_ids.shape
    tok, c_tok = LY.embedding_forward(x_ids, P["tok_emb"])  # G1: (B, L, E)
    pos, c_pos = LY.embedding_forward(np.arange(L), P["pos_emb"])  # G1: (L, E)
    x = tok + pos  # G1: (B, L, E) + (L, E)
    blocks = []
    for i in range(s.layers):
        layer = {n: P[f"layers.{i}.{n}"] for n in CB.PARAMS}
        cache, caches = CB.block_forward(layer, x, np.zeros_like(x), s.heads, causal=True)  # G2: (B, L, E)
        blocks.append((cache, caches))
        x = cache["y"]
    n, c_n = LY.layer_norm_forward(x, P["gamma_f"], P["beta_f"], EPS)  # G3: (B, L, E)
    logits, c_head = F.linear_forward(n, P["W_head"])  # G4: (B, L, E) @ (E, V) -> (B, L, V)
    loss, c_loss = LY.softmax_cross_entropy_forward(logits, y_ids)  # G5: ()
    g: dict = {}
    d = LY.softmax_cross_entropy_backward(1.0, c_loss)  # ← G5: (B, L, V)
    d, g["W_head"], _ = F.linear_backward(d, c_head)  # ← G4: (B, L, E)
    d, g["gamma_f"], g["beta_f"] = LY.layer_norm_backward(d, c_n)  # ← G3: (B, L, E)
    for i in reversed(range(s.layers)):  # ← G2: the last block first
        cache, caches = blocks[i]
        cache["d_y"], caches["d_y"] = d, d  # the block's "loss" sum(y * d_y) has d loss / d y = d
        got = CB.block_reference(caches) if block_backward is None else block_backward(C._copy(cache))
        g.update({f"layers.{i}.{n}": np.asarray(got[n]) for n in CB.PARAMS})
        d = np.asarray(got["x"])  # (B, L, E)
    g["tok_emb"] = LY.embedding_backward(d, c_tok)  # ← G1: repeated bytes add up
    g["pos_emb"] = LY.embedding_backward(d.sum(axis=0), c_pos)  # ← G1: pos was broadcast over the batch
    return loss, {name: g[name] for name in P}


windows = GC.windows  # (batch, length + 1) windows at random starts: one definition, the child's


def adam_step(P: dict, grads: dict, lr: float = 3e-3, clip: float = 1.0) -> dict:
    """One clipped Adam step from fresh moments on a copy of ``P`` (the stage-3 comparison)."""
    Q = {k: v.copy() for k, v in P.items()}
    Adam(Q, lr=lr).step(clip_grad_norm(grads, clip)[0])
    return Q


@dataclass
class Stage:
    """One stage's verdict: ``ok``, and what to print (the table and the diagnosis, or the parameter that differs)."""

    name: str
    ok: bool
    report: str


def _causal_case(seed: int = 0, B: int = 2, L: int = 3, E: int = 4, H: int = 2, inner: int = 8):
    rng = np.random.default_rng(seed)
    P = CB.block_params(E, H, inner, rng)
    return CB.block_forward(P, rng.standard_normal((B, L, E)), rng.standard_normal((B, L, E)), H, causal=True)


# stage 2: exercise 10's capstone on the same cases with causal attention
CAUSAL_BLOCK = C.Capstone(CB.BLOCK_BACKWARD, CB.BLOCK_STEPS, _causal_case, CB.block_reference, CB.BLOCK_CASES,
                          CB.BLOCK_BUGS, CB.block_paths)  # fmt: skip


def stage_block(block_backward: Callable, causal: bool) -> Stage:
    """Stages 1 and 2: exercise 10's comparison, on its own cases or on the same cases with causal attention."""
    capstone = CAUSAL_BLOCK if causal else CB.BLOCK
    for case in capstone.cases:
        result = C.compare(block_backward, capstone, case)
        if result.not_done or result.wrong is not None:
            return Stage("causal block" if causal else "block", False, str(result))
    return Stage("causal block" if causal else "block", True, "every gradient matches the library's backward")


STEP_RTOL = 1e-9  # one Adam step in float64: the student's and the library's backward agree to rounding


def stage_step(block_backward: Callable, sizes: GPTSizes | None = None, seed: int = 0, pairs: dict | None = None
               ) -> Stage:  # fmt: skip
    """Stage 3: one training step of a small GPT (two causal blocks) with the student's backward (and the student's
    ``pairs`` {name: (forward, backward)} around the blocks, ``gpt_child.GPT_PAIRS``) and the library's."""
    s = sizes or GPTSizes(vocab_size=11, context=5, hidden=8, layers=2, heads=2, inner=16)
    P = gpt_params(s, seed)
    ids = np.random.default_rng(seed + 1).integers(0, s.vocab_size, (3, s.context + 1))
    ref_loss, ref = loss_and_grads(P, ids, s, None)
    loss, got = GC.loss_and_grads(P, ids, asdict(s), block_backward, pairs)
    largest = max(np.abs(g).max() for g in ref.values())  # b_k's gradient is 0 in theory: judged against this
    for name in reversed(P):  # the backward's order: the head first, the embeddings last
        err = np.abs(np.asarray(got[name]) - ref[name]).max()
        if not err <= STEP_RTOL * largest:
            return Stage("step", False, f"the gradient of {name} differs from the library's by {err:.3g} (max "
                         f"|reference| {np.abs(ref[name]).max():.3g}); checked from the head down in the backward's "
                         "order, so this is the first parameter your backward gets wrong inside the GPT")  # fmt: skip
    after_ref, after = adam_step(P, ref), adam_step(P, got)
    err = max(np.abs(after[n] - after_ref[n]).max() for n in P)
    if not err <= STEP_RTOL:
        return Stage("step", False, f"the gradients match but the parameters after one Adam step differ by {err:.3g}")
    return Stage("step", True, f"one step matches the library's (loss {loss:.6f} = {ref_loss:.6f})")


def grade(block_backward: Callable) -> list[Stage]:
    """Stages 1-3, stopping at the first that fails (stage 4, the loss, is ``train``: minutes, not seconds; all five
    stages of ``check --gpt``: ``checker.gpt_stages``)."""
    stages = []
    for run in (lambda: stage_block(block_backward, False), lambda: stage_block(block_backward, True),
                lambda: stage_step(block_backward)):  # fmt: skip
        stages.append(run())
        if not stages[-1].ok:
            break
    return stages


def train(
    block_backward: Callable | None,
    train_ids: np.ndarray,
    val_ids: np.ndarray,
    sizes: GPTSizes = GPTSizes(),
    *,
    steps: int = 600,
    batch: int = 32,
    lr: float = 3e-3,
    seed: int = 0,
    log=None,
) -> tuple[float, list]:
    """Stage 4: train with ``block_backward`` (None: the library's) -> (validation loss on ``val_ids``, the training
    losses). The loop is ``gpt_child.train``'s, the one ``check --gpt`` runs in the student's process; validation is
    ``validation_loss``.

    Measured with exercise 10's worked solution and these defaults (3 blocks, E = 128, 600 steps of 32 windows) on
    the whole corpus: validation 1.5141 nats/byte against the best bigram's 2.2646 (66.9 %; the target is 75 %),
    542 s of CPU time on one BLAS thread (638 s of wall time on a shared machine). 300 steps gave 1.8593 (82 %):
    the loss sits near the bigram's for ~150 steps before attention starts to pay."""
    P = gpt_params(sizes, seed)
    with blas_single_threaded():
        _, losses, _ = GC.train(P, train_ids, asdict(sizes), block_backward or library_block_backward, steps=steps,
                                batch=batch, lr=lr, seed=seed, log=log)  # fmt: skip
        return validation_loss(P, val_ids, sizes), losses


def library_block_backward(cache: dict) -> dict:
    """The library's backward of a block from the cache ``gpt_child.block_forward`` makes (its forward run again)."""
    P = {n: cache[n] for n in CB.PARAMS}
    return CB.block_reference(CB.block_forward(P, cache["x"], cache["d_y"], cache["num_heads"], causal=True)[1])


def validation_loss(P: dict, val_ids: np.ndarray, sizes: GPTSizes) -> float:
    """Mean cross-entropy (nats/byte) over windows of L + 1 bytes, stride L, over all of ``val_ids`` (full windows
    only), with the library's forward: the verdict of stage 4 is computed here, never where the student's code runs."""
    L = sizes.context
    wins = np.stack([val_ids[s0 : s0 + L + 1] for s0 in range(0, len(val_ids) - L - 1, L)])  # (W, L + 1)
    with blas_single_threaded():
        total = sum(_loss(P, wins[i : i + 64], sizes) * len(wins[i : i + 64]) for i in range(0, len(wins), 64))
    return total / len(wins)


def _loss(P: dict, ids: np.ndarray, s: GPTSizes) -> float:
    """The forward alone (G1-G5), for validation."""
    x = LY.embedding_forward(ids[:, :-1], P["tok_emb"])[0] + P["pos_emb"][: ids.shape[1] - 1]  # (B, L, E)
    for i in range(s.layers):
        x = CB.block_forward({n: P[f"layers.{i}.{n}"] for n in CB.PARAMS}, x, np.zeros_like(x), s.heads, True)[0]["y"]
    n = LY.layer_norm_forward(x, P["gamma_f"], P["beta_f"], EPS)[0]
    return LY.softmax_cross_entropy_forward(F.linear_forward(n, P["W_head"])[0], ids[:, 1:])[0]
