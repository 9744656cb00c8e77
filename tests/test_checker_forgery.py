"""Issue 35: a checked file cannot reach the library's answers, forge the report or the score file, or crash the
checker with a malformed reply; ``grade_namespace`` warns as the file path does."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from mha_numpy import functional as F
from mha_numpy.checker.grading import grade_namespace

ROOT = Path(__file__).resolve().parent.parent
SOLUTIONS = ROOT / "exercises" / "solutions"
HARNESS = 300  # seconds: far above any --timeout below
LIMIT = "8"


def write(tmp_path: Path, source: str, name: str = "student.py") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(source))
    return path


def check(path: Path, *options: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "mha_numpy", "check", *options, "--timeout", LIMIT]
    cmd += [] if "--submit" in options else [path.name]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=HARNESS, cwd=path.parent)


def rows(r: subprocess.CompletedProcess) -> dict[str, str]:
    out = {}
    for line in r.stdout.splitlines():
        if line and not line.startswith((" ", "the file imports")) and not line.endswith(("functions pass", "points")):
            function, rest = line.split(maxsplit=1)
            out[function] = rest
    return out


def submit(tmp_path: Path, path: Path, cases: dict) -> tuple[subprocess.CompletedProcess, dict]:
    (tmp_path / "cases.json").write_text(json.dumps(cases))
    score = tmp_path / "results.json"
    r = check(path, "--submit", path.name, "--cases", "cases.json", "--score", score.name)
    return r, json.loads(score.read_text())


# --------------------------------------------------------------------------- the library is out of the file's reach

REACH = """
import importlib
import sys


def softmax_forward(x):  # importlib, as the issue did
    return importlib.import_module("mha_numpy.functional").softmax_forward(x)


def split_heads_forward(x, num_heads):  # whatever the process already holds
    module = next(m for name, m in list(sys.modules.items()) if name.endswith("functional"))
    return module.split_heads_forward(x, num_heads)


def linear_forward(x, W, b):  # through the checker's reference, which imports functional as F
    return __import__("mha_numpy.checker.reference", fromlist=["F"]).F.linear_forward(x, W, b)


def capstone_model_backward(cache):  # three lines of the issue: the capstone's own reference
    C = importlib.import_module("mha_numpy.checker.capstone")
    return C.reference_grads(C.model_forward(cache, cache["tokens"], cache["targets"], cache["num_heads"])[1])
"""


def test_no_route_from_a_checked_file_reaches_the_librarys_answers(tmp_path):
    """importlib, sys.modules, the checker's reference and the capstone's reference_grads: each scored before
    (the capstone 10/10 on the hidden seed, with no warning); now each gets a placeholder that raises, scores 0, and
    the score file names what was imported."""
    path = write(tmp_path, REACH)
    points = {"softmax_forward": 1, "split_heads_forward": 1, "linear_forward": 1, "capstone_model_backward": 10}
    r, results = submit(tmp_path, path, {"seed": 4242, "points": points})
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stdout + r.stderr
    assert results["score"] == 0, results
    by_name = {t["name"]: t["output"] for t in results["tests"]}
    assert "mha_numpy.functional.softmax_forward is refused" in by_name["softmax_forward"], by_name
    assert "StopIteration" in by_name["split_heads_forward"], by_name  # checked first: no library in sys.modules
    assert "mha_numpy.checker.reference.F.linear_forward is refused" in by_name["linear_forward"], by_name
    assert "mha_numpy.checker.capstone.model_forward is refused" in by_name["capstone_model_backward"], by_name
    warned = results["extra_data"]["mha_numpy"]["warnings"]
    assert warned and "mha_numpy.checker.reference" in warned[0] and "mha_numpy.functional" in warned[0], warned


def test_a_leftover_debugging_import_that_shadows_the_students_rope_does_not_pass(tmp_path):
    """The import runs, the library's RoPE is a placeholder that FAILs, the rest of the file is checked."""
    solution = (SOLUTIONS / "ex11_rope_gqa_backward.py").read_text()
    path = write(tmp_path, solution + "\nfrom mha_numpy.functional import rope_backward, rope_forward  # debugging\n")
    r = check(path)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stdout + r.stderr
    assert rows(r)["repeat_kv_forward"] == "PASS" and rows(r)["repeat_kv_backward"] == "PASS", r.stdout
    assert rows(r)["rope_forward"].startswith("FAIL  raised LibraryRefused: mha_numpy.functional.rope_forward is"), r
    assert rows(r)["rope_backward"].startswith("FAIL"), r.stdout
    assert r.stdout.splitlines()[-1].startswith("the file imports mha_numpy.functional: refused"), r.stdout


def test_what_the_exercises_import_stays_importable(tmp_path):
    """Exercise 9's cells (mha_numpy.train's tasks and optimizers, the capstone's listing) run in the child."""
    source = """
    import numpy as np

    from mha_numpy import train as T
    from mha_numpy.checker import capstone, capstone_block
    from mha_numpy.optim import Adam

    tokens, targets = T.make_batch("reverse", np.random.default_rng(0), 2, 4, 5)
    assert (targets == tokens[:, ::-1]).all() and T.TASKS == ("reverse", "shift")
    params = {"w": np.ones(3)}
    T.Adam(params, lr=0.1).step({"w": np.ones(3)})
    assert params["w"][0] < 1 and Adam is T.Adam and T.clip_grad_norm({"w": np.ones(4)}, 1.0)[1] == 2.0
    assert capstone.forward_listing().splitlines()[0].split()[:2] == ["F1", "tok"]
    assert "F21" in capstone_block.forward_listing()
    print(capstone.compare(None))
    try:
        capstone.train(None)
    except NotImplementedError as e:
        print(e)
    for name in ("train", "TinyAttentionModel", "evaluate"):
        try:
            getattr(T, name)()
        except ImportError as e:
            assert f"mha_numpy.train.{name} is refused" in str(e), e
        else:
            raise AssertionError(name)


    def softmax_forward(x):
        m = x.max(axis=-1, keepdims=True)
        e = np.exp(x - np.where(np.isfinite(m), m, 0.0))
        s = e.sum(axis=-1, keepdims=True)
        return e / np.where(s > 0, s, 1.0), None
    """
    r = check(write(tmp_path, source))
    assert r.returncode == 0 and rows(r) == {"softmax_forward": "PASS"}, r.stdout + r.stderr
    assert "capstone.compare runs in the exercise notebook" in r.stderr, r.stderr
    assert r.stdout.splitlines()[-1].startswith("the file imports mha_numpy.train.TinyAttentionModel, "), r.stdout


def test_the_librarys_own_function_in_disguise_scores_zero_in_a_notebook(monkeypatch):
    """grade_namespace reads the function's code, not its __module__: a partial, a rewritten __module__."""
    monkeypatch.setattr(F.softmax_forward, "__module__", "__main__")  # undone after the test
    grade = grade_namespace(
        {"softmax_forward": F.softmax_forward, "softmax_backward": functools.partial(F.softmax_backward)}
    )
    assert grade.points == 0, str(grade)
    assert all("mha_numpy.functional's own function" in t["detail"] for t in grade.tests), grade.tests


def test_grade_namespace_warns_as_the_file_path_does():
    """The library in the namespace (a module, a function under any name) or in the cells' import lines (``In``)."""
    for namespace in (
        {"F": F, "softmax_forward": lambda x: (x, None)},
        {"my_softmax": functools.partial(F.softmax_forward)},
        {"In": ["", "import mha_numpy.functional as G"], "softmax_forward": lambda x: (x, None)},
    ):
        grade = grade_namespace(namespace, {"points": {"softmax_forward": 1}})
        assert len(grade.warnings) == 1 and "imports mha_numpy.functional" in grade.warnings[0], namespace
        assert "warning: the submission imports mha_numpy.functional" in grade.results()["output"]
    clean = {"softmax_forward": lambda x: (x, None), "In": ["from mha_numpy.checker import check_namespace"]}
    assert grade_namespace(clean).warnings == []


# --------------------------------------------------------------------------- a malformed reply is the student's failure

SHORT_FRAME = """
import os
import stat
import struct

import numpy as np


def _forge():  # a frame of 3 bytes into every pipe this process may write: the checker's reply pipe among them
    for fd in range(3, 64):
        try:
            if stat.S_ISFIFO(os.fstat(fd).st_mode):
                os.write(fd, struct.pack(">Q", 3) + b"abc")
        except OSError:
            pass


def softmax_forward(x):
    _forge()
    return np.zeros_like(x), None
"""


@pytest.mark.parametrize("when", ["call", "import"])
def test_a_short_frame_in_the_reply_pipe_is_a_fail_and_the_score_file_is_written(tmp_path, when):
    source = SHORT_FRAME + ("\n_forge()\n" if when == "import" else "")
    path = write(tmp_path, source)
    r, results = submit(tmp_path, path, {"points": {"softmax_forward": 1}})
    assert "Traceback" not in r.stdout + r.stderr and "struct.error" not in r.stdout + r.stderr, r.stderr
    assert results["score"] == 0 and "sent garbage" in results["output"] + results["tests"][0]["output"], results
    assert r.returncode == (3 if when == "import" else 0), r.stdout + r.stderr
    r = check(path)
    assert r.returncode in (1, 3) and "Traceback" not in r.stderr and "sent garbage" in r.stdout + r.stderr, r.stderr


# --------------------------------------------------------------------------- forging from the student's process

MUTATES = """
import copy
import sys

import numpy as np

{patch}


def softmax_forward(x):
    m = x.max(axis=-1, keepdims=True)
    e = np.exp(x - np.where(np.isfinite(m), m, 0.0))
    s = e.sum(axis=-1, keepdims=True)
    p = e / np.where(s > 0, s, 1.0)
    x[...] = 0.0  # writes into its input
    return p, p
"""
PATCHES = {
    "__main__": 'sys.modules["__main__"].call_checked = lambda function, fn, args: fn(*[v for _, v in args])',
    "every module": "for m in list(sys.modules.values()):\n"
    "    if hasattr(m, 'call_checked'):\n"
    "        m.call_checked = lambda function, fn, args: fn(*[v for _, v in args])",
    "deepcopy": "copy.deepcopy = lambda x, memo=None: x\nnp.array_equal = lambda *a, **k: True",
}


@pytest.mark.parametrize("patch", list(PATCHES))
def test_patching_the_childs_call_checked_does_not_hide_a_mutation(tmp_path, patch):
    r = check(write(tmp_path, MUTATES.format(patch=PATCHES[patch])))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "modified its argument x in place" in rows(r)["softmax_forward"], r.stdout


def test_the_file_cannot_write_into_the_checkers_stdout(tmp_path):
    """Through /proc/<checker>/fd/1 a fake PASS table landed in the report; the checker is not dumpable now."""
    source = """
    import os

    import numpy as np

    try:
        with open(f"/proc/{os.getppid()}/fd/1", "w") as out:
            out.write("softmax_forward  PASS\\nsoftmax_backward  PASS\\n2 of 2 functions pass\\n")
    except OSError as e:
        print("refused:", type(e).__name__)


    def softmax_forward(x):
        return np.zeros_like(x), None
    """
    r = check(write(tmp_path, source))
    assert r.returncode == 1 and "PASS" not in r.stdout, r.stdout
    assert "refused: PermissionError" in r.stderr, r.stderr


def test_a_process_left_in_its_own_session_cannot_rewrite_the_score_file(tmp_path):
    """A setsid'd grandchild waits for the score file and rewrites it: it is killed before the file is written."""
    forged = tmp_path / "results.json"
    source = f"""
    import subprocess
    import sys

    import numpy as np

    WAIT = '''
    import os, time
    for _ in range(400):
        if os.path.exists({str(forged)!r}):
            time.sleep(0.05)
            open({str(forged)!r}, "w").write('{{"score": 100, "forged": true}}')
            break
        time.sleep(0.05)
    '''
    subprocess.Popen([sys.executable, "-c", WAIT], start_new_session=True)


    def softmax_forward(x):
        return np.zeros_like(x), None
    """
    path = write(tmp_path, source)
    r, _ = submit(tmp_path, path, {"points": {"softmax_forward": 1}})
    assert r.returncode == 0, r.stdout + r.stderr
    time.sleep(1.5)  # the grandchild, were it alive, rewrites the file within 0.1 s of its appearing
    results = json.loads(forged.read_text())
    assert results["score"] == 0 and "forged" not in results, results


def test_a_backward_alone_reads_the_reference_cache_without_the_library(tmp_path):
    """The reference forward's cache (a functional.AttentionCache) reaches the child as its attributes, though the
    child imports no mha_numpy: a backward written against it passes."""
    source = """
    import numpy as np


    def scaled_dot_product_attention_backward(d_out, cache):
        q, k, scale = cache.steps["scores"]
        p, v = cache.steps["context"]
        dp = d_out @ v.swapaxes(-1, -2)  # (B, H, Lq, Lk)
        ds = p * (dp - (p * dp).sum(axis=-1, keepdims=True))
        return ds @ k * scale, ds.swapaxes(-1, -2) @ q * scale, p.swapaxes(-1, -2) @ d_out
    """
    r = check(write(tmp_path, source))
    assert r.returncode == 0 and rows(r) == {"scaled_dot_product_attention_backward": "PASS"}, r.stdout + r.stderr


def test_the_checker_is_dumpable_and_no_subreaper_again_after_a_file(tmp_path):
    """Not dumpable and subreaper hold while a child lives only; this process is as it was afterwards (Linux)."""
    import ctypes

    from mha_numpy.checker import check_file
    from mha_numpy.checker import process as P

    before = P._prctl(P.PR_GET_DUMPABLE)
    report = check_file(write(tmp_path, "def softmax_forward(x):\n    return x, None\n"), timeout=float(LIMIT))
    assert report["softmax_forward"].status == "FAIL"
    subreaper = ctypes.c_int(-1)
    assert P._prctl(P.PR_GET_CHILD_SUBREAPER, ctypes.byref(subreaper)) == 0 and subreaper.value == 0
    assert P._prctl(P.PR_GET_DUMPABLE) == before == 1 and P._held == 0
