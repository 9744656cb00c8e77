"""verify safe to trust with a CI's exit code (issue 35): a function that writes into its inputs is judged against
the reference of the untouched inputs and fails for the writing, by name; a function that exits (sys.exit,
os._exit) or hangs fails its case with a message, and the command still prints its report and exits 1."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
from helpers import require_torch

from mha_numpy import testing as T
from mha_numpy.testing.cases import shrink

ROOT = Path(__file__).resolve().parents[1]
SMALL = [shrink(c) for c in T.matrix("quick")]
PLAIN = [c for c in SMALL if c.dtype in ("float64", "float32") and not c.needs() - {"backward"}]  # no mask, ...
MASKED = [c for c in SMALL if c.dtype == "float64" and c.mask is not None and c.form == "bool" and not c.needs() - {
          "backward", "mask"}][:2]  # fmt: skip


def correct():
    spec = importlib.util.spec_from_file_location("verify_trust_correct", ROOT / "examples" / "verify" / "correct.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --------------------------------------------------------------------------- a function that writes into its inputs


def zero_q_k_mean_of_v(q, k, v):
    """q and k zeroed in place: the scores are 0, the weights uniform, the output the mean of v over the keys,
    which is what the reference of the zeroed inputs gives."""
    q[...] = 0
    k[...] = 0
    return np.broadcast_to(v.mean(axis=2, keepdims=True), q.shape[:3] + v.shape[-1:]).copy()  # (B, H, Lq, d)


def test_a_numpy_function_that_zeroes_q_and_k_fails_for_writing_into_them():
    report = T.verify_attention(zero_q_k_mean_of_v, cases=PLAIN)
    assert not report.passed, str(report)
    ran = [r for r in report.results if r.status != "n/a"]
    assert len(ran) >= 6 and all(r.status == "FAIL" and r.written == ("q", "k") for r in ran), str(report)
    assert all("wrote into its input q, k" in r.message and "wrong: out" in r.message for r in ran)
    text = str(report)
    assert f"{len(ran)} cases wrote into the function's inputs (q, k)" in text and "a bug" not in text
    assert report.to_dict()["results"][0]["written"] == ["q", "k"]


def test_a_correct_numpy_function_that_scribbles_on_q_afterwards_fails_for_that_alone():
    attention = correct().attention

    def scribbles(q, k, v, **kw):
        out = attention(q, k, v, **kw)
        q += 1.0
        return out

    report = T.verify_attention(scribbles, cases=PLAIN + MASKED)
    ran = [r for r in report.results if r.status != "n/a"]
    assert len(ran) >= 8 and all(r.status == "FAIL" and r.written == ("q",) for r in ran), str(report)
    assert all(r.message.endswith("(what it returned is right)") for r in ran), str(report)
    assert all(c.passed for r in ran for c in r.checks.values())  # judged against the untouched q


def test_a_mask_written_into_is_seen_through_a_converted_copy():
    """The "ignore" convention hands the function a new mask (~ours): the adapter checks what it handed."""
    attention = correct().attention

    def clears_its_mask(q, k, v, mask=None):
        out = attention(q, k, v, mask=None if mask is None else ~mask)
        mask[...] = False
        return out

    report = T.verify_attention(clears_its_mask, cases=MASKED, mask_convention="ignore")
    assert [r.written for r in report.results] == [("mask",)] * len(MASKED), str(report)


def test_a_function_that_leaves_its_inputs_alone_still_passes():
    attention = correct().attention
    report = T.verify_attention(attention, correct().attention_vjp, cases=PLAIN + MASKED)
    assert report.passed and not any(r.written for r in report.results), str(report)


def test_torch_tensors_share_the_memory_and_are_checked_too():
    torch = require_torch()
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def zeroes(q, k, v):
        with torch.no_grad():
            q.zero_()
            k.zero_()
        return v.mean(dim=2, keepdim=True).expand(*q.shape[:3], v.shape[-1])

    bf16 = [c for c in SMALL if c.dtype == "bfloat16" and not c.needs() - {"backward"}]  # a copy: the adapter's
    cases = [c for c in PLAIN if c.dtype == "float64"] + bf16
    report = T.verify_attention(T.from_torch(zeroes, without=("backward",)), cases=cases)
    assert [r.written for r in report.results] == [("q", "k")] * len(cases), str(report)
    assert all(r.status == "FAIL" for r in report.results)

    def scribbles(q, k, v):
        out = sdpa(q, k, v)
        with torch.no_grad():
            q.add_(1.0)
        return out

    forward = T.verify_attention(T.from_torch(scribbles, without=("backward",)), cases=cases)
    assert [r.written for r in forward.results] == [("q",)] * len(cases), str(forward)
    assert all(r.message.endswith("(what it returned is right)") for r in forward.results), str(forward)
    both = T.verify_attention(T.from_torch(scribbles), cases=cases[:1])  # autograd refuses the written q: an ERROR
    assert both.results[0].status == "ERROR" and both.results[0].message.startswith("wrote into q, then raised")


def test_a_torch_mask_written_into_is_named_once_by_its_name_in_the_calling_convention():
    torch = require_torch()
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def opens_its_mask(q, k, v, attn_mask=None):
        out = sdpa(q, k, v, attn_mask=attn_mask)
        attn_mask.fill_(True)
        return out

    report = T.verify_attention(T.from_torch(opens_its_mask, without=("backward",)), cases=MASKED)
    assert [r.written for r in report.results] == [("mask",)] * len(MASKED), str(report)


# --------------------------------------------------------------------------- a function that exits or hangs

MISBEHAVES = '''
import ctypes, os, sys, time
sys.path.insert(0, {examples!r})
from correct import attention as correct


def attention(q, k, v, **kw):
    """What it does depends on the case (its Lq): it returns, exits in three ways, or hangs."""
    Lq = q.shape[2]
    if Lq == 1:
        sys.exit(0)
    if Lq == 3:
        os._exit(0)
    if Lq == 113:
        ctypes.CDLL(None).exit(0)  # C's exit: no Python guard sees it
    if Lq == 1023:
        while True:
            time.sleep(1)
    print("the function prints this")
    return correct(q, k, v, **kw)
'''


def test_the_command_reports_each_exit_and_hang_as_its_case_failure_and_exits_1(tmp_path):
    """Before: sys.exit(0) inside the function ended verify with exit code 0 and no report. After a hang the rest is
    not run: a function that hangs on every case would take the limit times the matrix."""
    target = tmp_path / "misbehaves.py"
    target.write_text(MISBEHAVES.format(examples=str(ROOT / "examples" / "verify")))
    page = tmp_path / "report.json"
    r = subprocess.run([sys.executable, "-m", "mha_numpy", "verify", f"{target}:attention", "--only",
                        "no mask [float32", "--timeout", "4", "--json", str(page)], capture_output=True, text=True,
                       timeout=300)  # fmt: skip
    assert r.returncode == 1, r.stdout + r.stderr
    assert "RESULT: FAIL: 1 passed, 0 failed, 5 ERROR of 6 cases" in r.stdout, r.stdout
    assert "the function prints this" in r.stderr and "prints this" not in r.stdout  # its output: stderr
    rows = {(x["shape"]["Lq"]): (x["status"], x["message"]) for x in json.loads(page.read_text())["results"]}
    assert rows[1] == ("ERROR", "called sys.exit(0): a function under test must return (its exit is a failure, "
                       "whatever the code)")  # fmt: skip
    assert rows[3][0] == "ERROR" and rows[3][1].startswith("called os._exit(0)")
    assert rows[113][0] == "ERROR" and rows[113][1].startswith("the process running it ended (exit code 0")
    assert rows[127][0] == "PASS"  # after an exit and the end of its process, the cases run on in a new one
    assert rows[1023][0] == "ERROR" and rows[1023][1].startswith("stopped after 4 s: the function did not return")
    assert rows[203] == ("ERROR", "not run: no mask [float32 B1 H2 1023x1024 d128] ran past the time limit before "
                         "it (--only to run the rest)")  # fmt: skip


WRITES_INTO_THE_PIPE = """
import fcntl, os, sys
sys.path.insert(0, {examples!r})
from correct import attention as correct


def attention(q, k, v, **kw):
    if q.shape[2] == 113:  # a frame that is no message, into every pipe it may write to
        for fd in map(int, os.listdir("/proc/self/fd")):
            try:
                if fd > 2 and fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_WRONLY:
                    os.write(fd, b"\\x00\\x00\\x00\\x02xx")
            except OSError:  # the directory's own descriptor, closed by now
                pass
    return correct(q, k, v, **kw)
"""


def test_garbage_written_into_verify_s_pipe_is_the_case_s_failure(tmp_path):
    target = tmp_path / "garbage.py"
    target.write_text(WRITES_INTO_THE_PIPE.format(examples=str(ROOT / "examples" / "verify")))
    r = subprocess.run([sys.executable, "-m", "mha_numpy", "verify", f"{target}:attention", "--only",
                        "no mask [float64", "--json", "-"], capture_output=True, text=True, timeout=300)  # fmt: skip
    assert r.returncode == 1, r.stdout + r.stderr
    rows = {x["shape"]["Lq"]: (x["status"], x["message"]) for x in json.loads(r.stdout)["results"]}
    assert rows[1][0] == rows[512][0] == "PASS", rows
    assert rows[113] == ("ERROR", "the process running it sent something that is not a message (UnpicklingError) "
                         "(something wrote into verify's pipe)"), rows  # fmt: skip


def test_a_module_that_ends_the_process_on_import_exits_3(tmp_path):
    bad = tmp_path / "leaves.py"
    bad.write_text("import os\nos._exit(0)\n")
    r = subprocess.run([sys.executable, "-m", "mha_numpy", "verify", f"{bad}:attention"], capture_output=True,
                       text=True, timeout=120)  # fmt: skip
    assert r.returncode == 3 and r.stderr.strip() == f"verify: importing {bad} called os._exit(0)", r.stderr


def test_verify_attention_in_process_turns_sys_exit_into_a_failure():
    def leaves(q, k, v):
        sys.exit(0)

    report = T.verify_attention(leaves, cases=PLAIN[:2])
    assert not report.passed and [r.status for r in report.results] == ["ERROR", "ERROR"], str(report)
    assert report.results[0].message.startswith("called sys.exit(0)")


def test_what_it_returns_is_read_under_the_same_guard():
    """An object's __array__ is the function's code too: its exception or exit is the case's failure, not verify's."""

    class Exits:
        def __array__(self, dtype=None, copy=None):
            sys.exit(0)

    class Raises:
        def __array__(self, dtype=None, copy=None):
            raise RuntimeError("no numbers here")

    for result, says in ((Exits(), "SystemExit: 0"), (Raises(), "RuntimeError: no numbers here")):
        report = T.verify_attention(lambda q, k, v, result=result: result, cases=PLAIN[:1])
        r = report.results[0]
        assert r.status == "FAIL" and r.message == f"returned what cannot be read as arrays ({says})", str(report)


def test_verify_attention_in_process_turns_os_exit_into_a_failure():
    """In a process of its own: without the guard, os._exit(0) would end this test run with exit code 0."""
    code = (
        "import os\nfrom mha_numpy import testing as T\nfrom mha_numpy.testing.cases import shrink\n"
        "case = shrink(T.matrix('quick')[0])\n"
        "report = T.verify_attention(lambda q, k, v: os._exit(0), cases=[case])\n"
        "print(report.results[0].status, report.results[0].message)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.stdout.startswith("ERROR called os._exit(0): a function under test must return"), r.stdout + r.stderr
