"""The checker is safe to grade with: hostile or careless student files end with the right verdict and exit code.

Each file runs in a child process with a time limit (``--timeout``); every call is on copies and a function that
changes its arguments or its cache FAILs. The harness's own ``timeout=`` (HARNESS) is only a bound, so that a
regression ends as a failure instead of a hang; no test measures a time.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from mha_numpy.checker import bugs, check_file, check_namespace
from mha_numpy.checker.diagnose import matching_bug

HARNESS = 300  # seconds: far above any --timeout below
LIMIT = "8"  # the checker's --timeout in these tests: seconds for importing a file and for each function's check

SOFTMAX = """
import numpy as np


def softmax_forward(x):
    m = x.max(axis=-1, keepdims=True)
    e = np.exp(x - np.where(np.isfinite(m), m, 0.0))
    s = e.sum(axis=-1, keepdims=True)
    p = e / np.where(s > 0, s, 1.0)
    return p, p


def softmax_backward(dp, cache):
    p = cache
    return p * (dp - (p * dp).sum(axis=-1, keepdims=True))
"""


def write(tmp_path: Path, source: str, name: str = "student.py") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(source))
    return path


def check(path: Path, *options: str, **kw) -> subprocess.CompletedProcess:
    """``python -m mha_numpy check NAME`` run in the file's directory (so messages name it as given)."""
    cmd = [sys.executable, "-m", "mha_numpy", "check", path.name, "--timeout", LIMIT, *options]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=HARNESS, cwd=path.parent, **kw)


def rows(r: subprocess.CompletedProcess) -> dict[str, str]:
    """function -> the rest of its line, for every row of the report on stdout."""
    out = {}
    for line in r.stdout.splitlines():
        if line and not line.startswith(" ") and "functions pass" not in line:
            function, rest = line.split(maxsplit=1)
            out[function] = rest
    return out


# --------------------------------------------------------------------------- while importing the file: exit 3


@pytest.mark.parametrize(
    "code, said",
    [
        ("import sys\nsys.exit(0)\n", "it called sys.exit(0)"),  # issue item 12: printed nothing and exited 0
        ("import sys\nsys.exit(1)\n", "it called sys.exit(1)"),
        ("import os\nos._exit(0)\n", "ended during importing student.py (exit code 0"),
        ("raise KeyboardInterrupt\n", "failed on import: KeyboardInterrupt"),
        ("while True:\n    pass\n", f"stopped after {LIMIT} s: importing student.py did not finish"),
    ],
    ids=["sys.exit(0)", "sys.exit(1)", "os._exit(0)", "KeyboardInterrupt", "endless loop"],
)
def test_a_file_that_exits_or_hangs_while_importing_could_not_run(tmp_path, code, said):
    r = check(write(tmp_path, SOFTMAX + code))
    assert r.returncode == 3, r.stdout + r.stderr
    assert said in r.stderr and len(r.stderr.strip().splitlines()) == 1 and r.stdout == "", r.stderr


# --------------------------------------------------------------------------- inside a function: that function FAILs

HOSTILE_FUNCTIONS = {  # function -> (its body, what its row says); the check goes on after each
    "linear_forward": ("import sys; sys.exit(0)", "raised SystemExit: 0"),
    "split_heads_forward": ("import sys; sys.exit(1)", "raised SystemExit: 1"),
    "merge_heads_forward": ("import os; os._exit(0)", "ended during merge_heads_forward (exit code 0"),
    "attention_scores_forward": ("raise SystemExit", "raised SystemExit: None"),
    "apply_mask_forward": ("raise KeyboardInterrupt", "raised KeyboardInterrupt"),
    "dropout_forward": ("while True: pass", f"stopped after {LIMIT} s: dropout_forward did not finish"),
}


@pytest.fixture(scope="module")
def hostile_functions(tmp_path_factory) -> subprocess.CompletedProcess:
    tmp = tmp_path_factory.mktemp("hostile")
    source = SOFTMAX + "".join(f"\n\ndef {f}(*args):\n    {body}\n" for f, (body, _) in HOSTILE_FUNCTIONS.items())
    return check(write(tmp, source))


@pytest.mark.parametrize("function", list(HOSTILE_FUNCTIONS))
def test_a_function_that_exits_or_hangs_fails_and_the_check_goes_on(hostile_functions, function):
    r = hostile_functions
    assert r.returncode == 1, r.stdout + r.stderr
    assert rows(r)[function].startswith("FAIL") and HOSTILE_FUNCTIONS[function][1] in rows(r)[function], r.stdout
    assert rows(r)["softmax_forward"] == "PASS" and rows(r)["softmax_backward"] == "PASS", r.stdout  # checked after
    assert "Traceback" not in r.stdout + r.stderr


THREADS = """
import threading
import time

STARTED = []


def forever():
    while True:
        time.sleep(0.1)


threading.Thread(target=forever).start()
"""


def test_threads_left_running_do_not_keep_the_checker_from_ending(tmp_path):
    """A non-daemon thread started at import, and one started by a function, both running forever."""
    start = (
        "    if not STARTED:\n        STARTED.append(threading.Thread(target=forever))\n        STARTED[0].start()\n"
    )
    source = SOFTMAX.replace("    p = cache\n", start + "    p = cache\n") + THREADS
    r = check(write(tmp_path, source))
    assert r.returncode == 0 and rows(r) == {"softmax_forward": "PASS", "softmax_backward": "PASS"}, r.stdout + r.stderr


def test_a_fake_pass_table_printed_by_the_file_is_not_the_report(tmp_path):
    fake = "softmax_forward   PASS\\nsoftmax_backward  PASS\\n2 of 2 functions pass"
    source = f'''
    print("{fake}")


    def softmax_forward(x):
        print("{fake}")
        return x, x


    def softmax_backward(dp, cache):
        return dp
    '''
    r = check(write(tmp_path, source))
    assert r.returncode == 1, r.stdout + r.stderr
    assert rows(r)["softmax_forward"].startswith("FAIL") and rows(r)["softmax_backward"].startswith("FAIL")
    assert r.stdout.splitlines()[-1] == "0 of 2 functions pass" and "PASS" not in r.stdout, r.stdout
    assert "  | softmax_forward   PASS" in r.stderr  # shown apart, marked as the file's output


def test_a_file_that_patches_numpy_the_checker_or_the_reference_still_fails(tmp_path):
    """The child only runs the student's code; the references, comparisons and verdicts are in the checker's
    process, which the file cannot reach: patching NumPy there changes nothing, and the checker's and the
    library's modules are refused to it (issue 35): patching them patches placeholders."""
    source = """
    import numpy as np

    np.allclose = lambda *a, **k: True
    np.testing.assert_allclose = lambda *a, **k: None
    np.array_equal = lambda *a, **k: True


    def softmax_forward(x):
        m = x.max(axis=-1, keepdims=True)
        e = np.exp(x - np.where(np.isfinite(m), m, 0.0))
        s = e.sum(axis=-1, keepdims=True)
        p = e / np.where(s > 0, s, 1.0)
        return p, p


    def softmax_backward(dp, cache):
        p = cache
        return p * (1 - p) * dp
    """
    r = check(write(tmp_path, source))
    assert r.returncode == 1, r.stdout + r.stderr
    assert rows(r)["softmax_forward"] == "PASS" and rows(r)["softmax_backward"].startswith("FAIL"), r.stdout
    assert "The diagonal-only softmax backward" in r.stdout
    for module in ("mha_numpy.checker.diagnose", "mha_numpy.checker.runner", "mha_numpy.functional", "mha_numpy.pairs"):
        patch = f"import {module}\n{module}.compare = {module}.softmax_backward = lambda *a, **k: None\n"
        r = check(write(tmp_path, patch + textwrap.dedent(source)))
        assert r.returncode == 1 and "The diagonal-only softmax backward" in r.stdout, r.stdout + r.stderr
        assert r.stdout.splitlines()[-1].startswith(f"the file imports {module}: refused"), r.stdout


PAST_THE_GUARD = """
import sys

sys.path.insert(0, {root!r})


def unguard():
    sys.meta_path[:] = [f for f in sys.meta_path if "guard" not in type(f).__name__.lower()]
    for name in [n for n in sys.modules if n.split(".")[0] == "mha_numpy"]:
        del sys.modules[name]
    from mha_numpy.functional import softmax_forward

    return softmax_forward
"""


@pytest.mark.parametrize("when", ["import", "call"])
def test_a_file_that_loads_the_library_past_the_guard_fails(tmp_path, when):
    """Removing the guard from sys.meta_path and importing the library's files by hand (item h02 of the trial set):
    the child checks its guard after loading the file and after every call, and fails the file (exit 3), or the
    call, naming it, so the library's pair never PASSes."""
    source = PAST_THE_GUARD.format(root=str(Path(__file__).resolve().parent.parent))
    if when == "import":
        source += "\nsoftmax_forward = unguard()\n"
    else:
        source += "\n\ndef softmax_forward(x):\n    return unguard()(x)\n"
    r = check(write(tmp_path, source))
    if when == "import":
        assert r.returncode == 3 and "removed the checker's import guard" in r.stderr and r.stdout == "", (
            r.stdout + r.stderr
        )
    else:
        assert r.returncode == 1 and rows(r)["softmax_forward"].startswith("FAIL"), r.stdout + r.stderr
        assert "import guard" in rows(r)["softmax_forward"], r.stdout


def test_the_file_runs_with_a_clean_environment_in_a_scratch_directory(tmp_path):
    source = (
        SOFTMAX
        + """
import os

print("secret:", os.environ.get("GRADER_SECRET"))
open("stray.txt", "w").write("written by the student")
"""
    )
    env = {**os.environ, "GRADER_SECRET": "s3cr3t"}
    r = check(write(tmp_path, source), env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "secret: None" in r.stderr and "s3cr3t" not in r.stdout + r.stderr
    assert not (tmp_path / "stray.txt").exists()


def test_rows_are_printed_as_they_are_known(tmp_path):
    """The first row is on stdout while a later function is still running (here: until the time limit stops it)."""
    source = SOFTMAX.replace("    p = cache\n", "    while True:\n        pass\n")
    cmd = [sys.executable, "-m", "mha_numpy", "check", str(write(tmp_path, source)), "--timeout", "60"]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        try:
            first = proc.stdout.readline()
            still_running = proc.poll() is None
        finally:
            proc.kill()
            proc.communicate()
    assert first.split() == ["softmax_forward", "PASS"] and still_running


# --------------------------------------------------------------------------- in-place mutation (issue item 14)

FORWARD_WRITES_INPUT = """
import numpy as np


def softmax_forward(x):  # correct values, but computed in the caller's array
    m = x.max(axis=-1, keepdims=True)
    x -= np.where(np.isfinite(m), m, 0.0)
    np.exp(x, out=x)
    x /= np.where(x.sum(axis=-1, keepdims=True) > 0, x.sum(axis=-1, keepdims=True), 1.0)
    return x, x


def softmax_backward(dp, cache):
    p = cache
    return p * (dp - (p * dp).sum(axis=-1, keepdims=True))
"""
BACKWARD_OVERWRITES_CACHE = SOFTMAX.replace(
    "    return p * (dp - (p * dp).sum(axis=-1, keepdims=True))",
    "    p *= dp - (p * dp).sum(axis=-1, keepdims=True)  # the right dx, written over the cache\n    return p",
)
MASK_WRITES_INPUT = """
import numpy as np


def apply_mask_forward(scores, mask):
    if mask.dtype == bool:
        scores[~np.broadcast_to(mask, scores.shape)] = -np.inf
    else:
        scores += mask
    return scores, np.isneginf(scores)


def apply_mask_backward(d_out, cache):
    blocked = cache
    return np.where(blocked, 0.0, d_out)
"""
MUTATIONS = {  # case -> (source, the function that mutates, what it changed, its correct partner that must PASS)
    "softmax forward writes into x": (FORWARD_WRITES_INPUT, "softmax_forward", "its argument x", "softmax_backward"),
    "softmax backward overwrites its cache": (
        BACKWARD_OVERWRITES_CACHE,
        "softmax_backward",
        "its cache",
        "softmax_forward",
    ),
    "mask forward writes into scores": (
        MASK_WRITES_INPUT,
        "apply_mask_forward",
        "its argument scores",
        "apply_mask_backward",
    ),
}


def _namespace(source: str) -> dict:
    namespace: dict = {}
    exec(textwrap.dedent(source), namespace)  # noqa: S102 - the test's own student code
    return {k: v for k, v in namespace.items() if callable(v)}


@pytest.mark.parametrize("case", list(MUTATIONS))
def test_in_place_mutation_fails_the_function_that_did_it_in_a_notebook(case):
    """Before: all three passed the mutating function, and the last two failed the correct partner (against a
    finite difference of corrupted inputs; one with a false "mask leak" diagnosis)."""
    source, culprit, what, partner = MUTATIONS[case]
    report = check_namespace(_namespace(source))
    assert report[culprit].status == "FAIL" and f"{culprit} modified {what} in place" in report[culprit].detail
    assert report[culprit].bug is None
    assert report[partner].status == "PASS" and report[partner].bug is None, str(report)


@pytest.mark.parametrize("case", list(MUTATIONS))
def test_in_place_mutation_fails_the_function_that_did_it_in_a_file(tmp_path, case):
    source, culprit, what, partner = MUTATIONS[case]
    r = check(write(tmp_path, source))
    assert r.returncode == 1, r.stdout + r.stderr
    assert rows(r)[culprit].startswith("FAIL") and f"{culprit} modified {what} in place" in rows(r)[culprit]
    assert rows(r)[partner] == "PASS" and "diagnosis" not in r.stdout, r.stdout


def test_a_bug_variant_equal_to_the_correct_answer_is_never_named():
    """The mask leak (``return d_out``) equals the correct backward where nothing is blocked (a float mask): a
    student's output equal to both must not be diagnosed as the leak."""
    d = np.random.default_rng(0).standard_normal((2, 3))
    leak = bugs.find("mask_leak")

    def run_variant(bug):
        return {"scores": d}

    assert matching_bug("apply_mask_backward", {"scores": d}, run_variant, 1.0, {"scores": d}) is None
    assert matching_bug("apply_mask_backward", {"scores": d}, run_variant, 1.0, {"scores": 0 * d}) is leak


# --------------------------------------------------------------------------- in a notebook (in this process)


def test_in_a_notebook_sys_exit_is_a_fail_and_an_interrupt_stops_the_check():
    """check_namespace runs in the kernel: no child process, no time limit. sys.exit in a function is that
    function's FAIL; KeyboardInterrupt (the user stopping the cell) is let through."""
    ns = _namespace(SOFTMAX)

    def exits(*args):
        raise SystemExit(3)

    report = check_namespace({**ns, "linear_forward": exits})
    assert report["linear_forward"].status == "FAIL" and "raised SystemExit: 3" in report["linear_forward"].detail
    assert report["softmax_backward"].status == "PASS"

    def interrupted(*args):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        check_namespace({**ns, "linear_forward": interrupted})


def test_check_file_from_python_runs_the_file_in_a_child_process(tmp_path):
    path = write(tmp_path, SOFTMAX + "\nimport os\nPID = os.getpid()\n\n\ndef softmax_cross_entropy_forward(*a):\n"
                 "    raise ValueError(f'pid {os.getpid()}')\n")  # fmt: skip
    lines: list[str] = []
    report = check_file(path, timeout=float(LIMIT), echo=lines.append)
    row = report["softmax_cross_entropy_forward"]
    assert row.status == "FAIL" and "raised ValueError: pid" in row.detail
    assert f"pid {os.getpid()}" not in row.detail  # not this process
    assert "\n".join(lines) == str(report)


def test_the_child_ends_when_the_checker_is_killed_while_a_student_loop_runs(tmp_path):
    """A checker killed (SIGKILL: no close(), no time limit left) while the student's import loops forever: the
    child must not run on as an orphan (two ran for an hour here after test runs were killed)."""
    import signal
    import time

    student = tmp_path / "loops.py"
    student.write_text("while True:\n    pass\n")
    parent = textwrap.dedent(
        f"""
        import sys
        from mha_numpy.checker.process import ChildProcess
        import mha_numpy.checker.process as P
        real = P.subprocess.Popen
        def popen(*a, **k):
            proc = real(*a, **k)
            print(proc.pid, flush=True)  # the child's pid, for the test
            return proc
        P.subprocess.Popen = popen
        ChildProcess({str(student)!r}, timeout=600)  # its import loops: this blocks
        """
    )
    checker = subprocess.Popen([sys.executable, "-c", parent], stdout=subprocess.PIPE, text=True)
    child = int(checker.stdout.readline())
    time.sleep(1.0)  # the child is importing the loop now
    checker.send_signal(signal.SIGKILL)
    checker.wait()
    for _ in range(100):  # the watchdog looks every 0.5 s; the orphan's new parent reaps it
        try:
            os.kill(child, 0)  # still there?
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        os.kill(child, signal.SIGKILL)
        raise AssertionError("the checker's child outlived the checker")
