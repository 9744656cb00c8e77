"""Exercise 15 graded as ``python -m mha_numpy check --gpt FILE`` grades it: one row per stage, the first FAIL ends it.

    stage 0 pairs         every pair the file defines (linear, layer_norm, softmax, ...: the ones its block backward
                          may call, and embedding, layer_norm, linear, softmax_cross_entropy, which the GPT around
                          the blocks uses when the file has both halves): the checker's per-pair comparison
                          (``runner.check_student``), the first wrong function named with its diagnosis
    stage 1 block         exercise 10's capstone (``runner.check_capstone`` on ``capstone_block.BLOCK``)
    stage 2 causal block  the same on the causal cases (``capstone_gpt.CAUSAL_BLOCK``)
    stage 3 step          one training step of a two-block GPT built from the student's block backward and pairs,
                          against the library's (``capstone_gpt.stage_step``)
    stage 4 loss          ``Training``: the GPT trained in the student's process (``gpt_child.train``, stopped at the
                          stated time); the validation loss computed here from the parameters it returns, against the
                          exact best bigram on the same split (``data.corpus.best_bigram``)

``TRAININGS``: ``full`` is the stated target (the notebook's and docs/course.md's); ``small`` the same stage on a
one-block model and a slice of the text, seconds long, with its own target (for the tests, and a first try);
``off`` leaves stage 4 out (a student iterating on stages 0-3).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np

from ..data import corpus
from ..threads import blas_single_threaded
from . import capstone_block as CB
from . import capstone_gpt as G
from . import cases
from .gpt_child import GPT_PAIRS
from .runner import NOT_DONE, Row, check_capstone, check_student, raised
from .student import Abort, Mutated, StudentFault


@dataclass(frozen=True)
class Training:
    """Stage 4's run and its targets: validation loss at most ``target`` x the best bigram's, within ``seconds`` of
    CPU time (one BLAS thread, as the child runs: the count of a busy machine's kernel, not its clock; the run is
    stopped after ``WALL_FACTOR`` times as many seconds of wall time)."""

    name: str
    sizes: G.GPTSizes
    steps: int
    batch: int
    target: float
    seconds: float
    train_bytes: int | None = None  # None: the whole training split
    val_bytes: int | None = None
    lr: float = 3e-3
    seed: int = 0


FULL = Training("full", G.GPTSizes(context=32), steps=900, batch=32, target=0.75, seconds=600.0)
SMALL = Training("small", G.GPTSizes(context=16, hidden=32, layers=1, heads=2, inner=128), steps=300, batch=16,
                 target=0.95, seconds=60.0, train_bytes=300_000, val_bytes=30_000, lr=2e-2)  # fmt: skip
TRAININGS = {"full": FULL, "small": SMALL, "off": None}
WALL_FACTOR = 3.0  # a machine shared with other work: the wall clock may run slower than the CPU time
STAGES = ("stage 0 pairs", "stage 1 block", "stage 2 causal block", "stage 3 step", "stage 4 loss")


def _row(stage: str, row: Row) -> Row:
    return Row(stage, row.status, row.detail, row.bug, row.relation)


def stage_pairs(student) -> tuple[Row, dict]:
    """Stage 0 -> (its row, the student's pairs the GPT uses: {name: (forward, backward)} of ``GPT_PAIRS``)."""
    names = {p.name for p in cases.PAIRS if {f"{p.name}_forward", f"{p.name}_backward"} & set(student.names)}
    if not names:
        return Row(STAGES[0], "PASS", "no pairs of your own: the GPT uses the library's around your blocks"), {}
    rows = check_student(student, only=names)
    wrong = next((r for r in rows if r.status == "FAIL"), None)
    if wrong is not None:
        return Row(STAGES[0], "FAIL", f"{wrong.function}: {wrong.detail}", wrong.bug, wrong.relation), {}
    passed = {r.function for r in rows if r.status == "PASS"}
    used = [n for n in GPT_PAIRS if {f"{n}_forward", f"{n}_backward"} <= passed]
    todo = sorted(r.function for r in rows if r.status == NOT_DONE)
    detail = f"{len(passed)} functions pass" + (f"; the GPT uses your {', '.join(used)}" if used else "")
    detail += f"; not done yet (left to the library): {', '.join(todo)}" if todo else ""
    return Row(STAGES[0], "PASS", detail), {n: _student_pair(student, n) for n in used}


_ARGS = {"embedding": ("ids", "table"), "layer_norm": ("x", "gamma", "beta", "eps"), "linear": ("x", "W", "b"),
         "softmax_cross_entropy": ("logits", "targets")}  # fmt: skip


def _call(student, function: str, args: list, keep_cache: bool = True):
    """``student.call``; a crash or a mutation names the function (stage 3 calls several)."""
    try:
        return student.call(function, args, keep_cache=keep_cache)
    except (Mutated, Abort, NotImplementedError):
        raise
    except Exception as e:  # noqa: BLE001 - the student's crash (a StudentFault from a child, or its own in a notebook)
        raise StudentFault(f"{function} {raised(e)}") from None


def _student_pair(student, name: str) -> tuple[Callable, Callable]:
    """The student's pair ``name`` as two callables going through ``student.call`` (copies, mutation checks)."""

    def forward(*args):
        return _call(student, f"{name}_forward", list(zip(_ARGS[name], args)))

    def backward(d_out, cache):
        return _call(student, f"{name}_backward", [("d_out", d_out), ("cache", cache)])

    return forward, backward


def _block_backward(student) -> Callable:
    return lambda cache: _call(student, CB.BLOCK_BACKWARD, [("cache", cache)], keep_cache=False)


def stage_step(student, pairs: dict) -> Row:
    """Stage 3 on the student's functions (``capstone_gpt.stage_step``)."""
    student.start(CB.BLOCK_BACKWARD)
    try:
        with np.errstate(all="ignore"):
            stage = G.stage_step(_block_backward(student), pairs=pairs)
    except NotImplementedError:
        return Row(STAGES[3], NOT_DONE)
    except (Mutated, StudentFault) as e:
        return Row(STAGES[3], "FAIL", f"{e} (in one training step of the GPT)")
    return Row(STAGES[3], "PASS" if stage.ok else "FAIL", stage.report)


def corpus_split(training: Training) -> tuple[np.ndarray, np.ndarray, float]:
    """The byte ids of the training and validation split (sliced as ``training`` says) and the best bigram's
    validation cross-entropy on them (nats/byte)."""
    split, tok = corpus.load_split(), corpus.ByteTokenizer()
    train_ids = tok.encode(split.train)[: training.train_bytes]
    val_ids = tok.encode(split.validation)[: training.val_bytes]
    return train_ids, val_ids, corpus.best_bigram(train_ids, val_ids)[0]


def stage_loss(student, pairs: dict, training: Training) -> Row:
    """Stage 4: train in the student's process (a file's child, stopped at ``training.seconds``; a notebook's
    namespace in this one), then judge the returned parameters here."""
    train_ids, val_ids, bigram = corpus_split(training)
    P = G.gpt_params(training.sizes, training.seed)
    settings = dict(steps=training.steps, batch=training.batch, lr=training.lr, seed=training.seed)
    began, cpu_began = time.perf_counter(), _cpu(student)
    try:
        if hasattr(student, "train"):  # a ChildProcess: the loop runs beside the student's functions
            P, losses = student.train(P, train_ids, asdict(training.sizes), {**settings, "pairs": sorted(pairs)},
                                      WALL_FACTOR * training.seconds)  # fmt: skip
        else:
            space = student.namespace
            mine = {n: (space[f"{n}_forward"], space[f"{n}_backward"]) for n in pairs}
            with np.errstate(all="ignore"), blas_single_threaded():  # as in a child: one BLAS thread
                P, losses, _ = G.GC.train(P, train_ids, asdict(training.sizes), space[CB.BLOCK_BACKWARD], mine,
                                          **settings)  # fmt: skip
    except NotImplementedError:
        return Row(STAGES[4], NOT_DONE)
    except Abort as e:
        if "stopped after" in str(e):
            return Row(STAGES[4], "FAIL", f"missed the time target: the training did not finish within "
                       f"{WALL_FACTOR * training.seconds:g} s of wall time (the target: {training.seconds:g} s of CPU "
                       "time)")  # fmt: skip
        return Row(STAGES[4], "FAIL", str(e))
    except StudentFault as e:
        return Row(STAGES[4], "FAIL", f"during the training: {e}")
    except Exception as e:  # noqa: BLE001 - a student's crash in this process (a notebook) is a FAIL, not ours
        return Row(STAGES[4], "FAIL", f"during the training: raised {type(e).__name__}: {str(e)[:100]}")
    wall, cpu = time.perf_counter() - began, _cpu(student)
    seconds = wall if cpu is None or cpu_began is None else cpu - cpu_began
    problem = _bad_params(P, G.gpt_params(training.sizes, training.seed))
    if problem:
        return Row(STAGES[4], "FAIL", problem)
    val = G.validation_loss(P, val_ids, training.sizes)
    ratio = val / bigram
    said = (f"validation {val:.4f} nats/byte, the best bigram {bigram:.4f} on the same split: ratio {ratio:.3f} "
            f"(target <= {training.target:g}); {seconds:.0f} s of CPU time (limit {training.seconds:g} s), "
            f"{wall:.0f} s of wall time; training loss {losses[0]:.3f} -> {losses[-1]:.3f} in {len(losses)} "
            "steps")  # fmt: skip
    if not ratio <= training.target:
        return Row(STAGES[4], "FAIL", f"missed the loss target: {said}")
    if not seconds <= training.seconds:
        return Row(STAGES[4], "FAIL", f"missed the time target: {said}")
    return Row(STAGES[4], "PASS", said)


def _cpu(student) -> float | None:
    """The CPU seconds the process running the student's code has used (a ChildProcess's, or this one's)."""
    return student.cpu_seconds() if hasattr(student, "cpu_seconds") else time.process_time()


def _bad_params(P, like: dict) -> str:
    """Empty when ``P`` (what the training returned) has every parameter of ``like`` with its shape, finite."""
    if not isinstance(P, dict) or set(P) != set(like):
        return "the training returned something else than the GPT's parameters"
    for name, value in like.items():
        got = np.asarray(P[name])
        if got.shape != value.shape or not np.issubdtype(got.dtype, np.floating):
            return f"the training returned {name} of shape {got.shape}, expected {value.shape}"
        if not np.isfinite(got).all():
            return f"the training diverged: {name} holds NaN or inf after it"
    return ""


def check_gpt(student, training: Training | None, on_row: Callable[[Row], None], note=None) -> None:
    """Stages 0-4 (``training`` None: 0-3) on ``student`` (a ChildProcess or an InProcess), ``on_row(row)`` for each
    stage as it is known, stopping at the first that does not pass; ``note(line)`` says when the training starts."""
    if CB.BLOCK_BACKWARD not in student.names:
        on_row(Row(STAGES[1], "FAIL", f"{CB.BLOCK_BACKWARD} is not defined: exercise 15 stacks it into the GPT"))
        return
    row, pairs = stage_pairs(student)
    on_row(row)
    runs = [lambda: _row(STAGES[1], check_capstone(student, CB.BLOCK)),
            lambda: _row(STAGES[2], check_capstone(student, G.CAUSAL_BLOCK)),
            lambda: stage_step(student, pairs)]  # fmt: skip
    if training is not None:

        def loss() -> Row:
            if note is not None:
                note(f"stage 4: training the GPT with your backward ({training.name}: {training.steps} steps, at most "
                     f"{training.seconds:g} s of CPU time)...")  # fmt: skip
            return stage_loss(student, pairs, training)

        runs.append(loss)
    for run in runs:
        if row.status != "PASS":
            return
        row = run()
        on_row(row)
