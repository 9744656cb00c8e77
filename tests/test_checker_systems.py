"""Exercise 13's systems stage (checker.systems): the peak memory and the time of the student's process measured by the
checker from outside it (checker.resident: /proc), against the library's chunked kernel measured the same way in a
process of its own. L = 2048 here (the stage's default is 4096) to stay fast; timing verdicts are tested only with
thresholds no run can miss or meet, or a sleep no load can hide. The hostile files of tests/data/students/systems_*.py
each fooled the stage as it was (under tracemalloc, in the student's process), or would fool a high-water mark read
only after the call."""

import subprocess
import sys
import time
from pathlib import Path

import pytest

from mha_numpy.checker import SKIPPED, check_file, resident
from mha_numpy.checker.process import ChildProcess
from mha_numpy.checker.systems import FUNCTION, NOT_MEASURED, check_systems, inputs, verdict

ROOT = Path(__file__).resolve().parents[1]
SOLUTION = ROOT / "exercises" / "solutions" / "ex13_flash_backward.py"
STUDENTS = ROOT / "tests" / "data" / "students"
FULL_MATRIX = STUDENTS / "flash_full_matrix.py"
L = 2048
MiB = 2**20


def test_solution_meets_the_memory_target_measured_from_outside_and_reports_its_time_ratio():
    with ChildProcess(SOLUTION, 60) as child:
        row = check_systems(child, L, time_ratio=1e9)
    assert row.status == "PASS", row.detail
    assert "memory target" not in row.detail
    assert "measured by the checker: high-water mark reset before the call" in row.detail
    assert "× the library's chunked kernel" in row.detail


def test_each_measured_call_of_the_student_has_its_own_time_limit_not_the_librarys_rounds(monkeypatch):
    """Trial c07 (a correct flash pair) timed out under --timeout 10 on a loaded machine: the student's time limit was
    started once before the stage, so the library's process start and its three rounds used it up. A library slowed
    by a sleep per round far beyond the student's limit in all, and each student call still within its own."""
    from mha_numpy.checker import systems

    measured = systems.measured_call

    def slow_library(process, *args, **kw):
        if process is not student:
            time.sleep(1.5)  # three rounds: 4.5 s, beyond the student's 3 s
        return measured(process, *args, **kw)

    monkeypatch.setattr(systems, "measured_call", slow_library)
    with ChildProcess(SOLUTION, 3) as student:
        row = check_systems(student, L, memory_fraction=1e9, time_ratio=1e9)
    assert row.status == "PASS", row.detail


def test_a_kernel_that_builds_the_full_matrix_fails_the_memory_target_named():
    report = check_file(FULL_MATRIX, systems_size=L)
    rows = {r.function: r for r in report.rows}
    assert rows["flash_attention_forward"].status == rows["flash_attention_backward"].status == "PASS"
    row = rows[FUNCTION]
    assert row.status == "FAIL"
    assert row.detail.startswith("memory target missed") or row.detail.startswith("memory and time target missed")
    peak_fraction = float(row.detail.split(" = ")[1].split()[0])
    assert peak_fraction >= 1.0, row.detail  # at least one whole (L, L) array, measured


@pytest.mark.parametrize(
    ("name", "verdict_words"),
    [
        ("systems_tracemalloc_off", "memory missed"),  # stops and fakes tracemalloc: a peak of 0 before
        ("systems_outside_numpy", "memory missed"),  # (L, L) in an mmap and C's calloc: 4 MiB before
        ("systems_resets_its_mark", "memory missed"),  # resets its own VmHWM after each call
        ("systems_sleeps", "time missed"),  # sleeps 2 s, its own clocks say 0: 1.4x before
        ("systems_large_inputs_wrong", "differs from the library's"),  # zeros at large L, fast and small: passed
        ("systems_reserved_ahead", "memory not confirmed"),  # (L, L) in memory touched at import: 4 MiB before
        ("systems_in_a_subprocess", "memory missed"),  # (L, L) in a process it starts: 12.6 MiB without its tree
    ],
)
def test_a_hostile_file_fails_the_target_it_tries_to_fool(name, verdict_words):
    with ChildProcess(STUDENTS / f"{name}.py", 60) as child:
        row = check_systems(child, L, repeats=1)
    assert row.status == "FAIL", row.detail
    verdict = row.detail if name == "systems_large_inputs_wrong" else row.detail.split(": ")[0]  # the target named
    assert all(word in verdict for word in verdict_words.split()), row.detail


def test_an_absurd_time_target_fails_named_and_memory_stays_separate():
    with ChildProcess(SOLUTION, 60) as child:
        row = check_systems(child, L, time_ratio=1e-9, repeats=1)
    assert row.status == "FAIL"
    assert row.detail.startswith("time target missed"), row.detail


def test_without_a_writable_clear_refs_the_stage_still_measures_honestly():
    """reset=False: the high-water mark since the process started. The solution's call raises it (exact); the whole
    matrix is still seen; a mark the call did not raise (a call at L = 4096 before) is only a bound above the peak,
    and a bound above the target fails the target as not confirmed (never a pass)."""
    with ChildProcess(SOLUTION, 60) as child:
        row = check_systems(child, L, time_ratio=1e9, reset=False, repeats=1)
    assert row.status == "PASS" and "high-water mark raised by the call" in row.detail, row.detail
    with ChildProcess(FULL_MATRIX, 60) as child:
        row = check_systems(child, L, time_ratio=1e9, reset=False, repeats=1)
    assert row.status == "FAIL" and row.detail.startswith("memory target missed"), row.detail
    with ChildProcess(SOLUTION, 60) as child:
        q, k, v, _ = inputs(2 * L)
        child.call("flash_attention_forward", [("q", q), ("k", k), ("v", v), ("mask", None), ("block", 128)], False)
        row = check_systems(child, L, time_ratio=1e9, reset=False, repeats=1)
    assert row.status == "FAIL" and row.detail.startswith("memory target not confirmed"), row.detail
    assert "could not be reset" in row.detail and "peak between" in row.detail, row.detail


def test_watch_sees_an_l_by_l_array_whatever_allocates_it_and_nothing_when_nothing_is_built():
    """The calibration at L = 4096: a process that writes one (L, L) float64 array (NumPy, a bytearray) shows 128 MiB
    more (134.0 and 134.3 MB measured: 99.9% and 100.05% of it); one that sleeps, or only reserves the array without
    writing it, shows almost nothing."""
    code = (
        "import sys, time, numpy as np\nL = 4096\nprint('ready', flush=True)\nfor line in sys.stdin:\n"
        "    what = line.strip()\n"
        "    if what == 'numpy': a = np.ones((L, L)); a += 1; del a\n"
        "    if what == 'bytearray': b = bytearray(8 * L * L); del b\n"
        "    if what == 'empty': e = np.empty((L, L)); del e\n"
        "    if what == 'sleep': time.sleep(0.2)\n"
        "    print('done', flush=True)\n"
    )
    with subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as p:
        assert p.stdout.readline() == "ready\n"
        peaks = {}
        for what in ("numpy", "bytearray", "empty", "sleep"):
            with resident.Watch(p.pid) as watch:
                p.stdin.write(what + "\n")
                p.stdin.flush()
                assert p.stdout.readline() == "done\n"
            peaks[what] = watch.peak()
        p.stdin.close()
    full = 8 * 4096 * 4096  # less 1%: pages the allocator had free and resident, the kernel's per-CPU counters
    assert peaks["numpy"].low >= 0.99 * full and peaks["bytearray"].low >= 0.99 * full, peaks
    assert peaks["empty"].high < 8 * MiB and peaks["sleep"].high < 8 * MiB, peaks
    assert all(p.exact for p in peaks.values()), peaks


def test_verdict_names_each_missed_or_unconfirmed_target():
    full = 100
    assert verdict(10, 10, 1.0, full, 1.0, 0.5, 3.0).status == "PASS"
    assert verdict(60, 60, 1.0, full, 1.0, 0.5, 3.0).detail.startswith("memory target missed")
    assert verdict(10, 10, 4.0, full, 1.0, 0.5, 3.0).detail.startswith("time target missed")
    assert verdict(60, 60, 4.0, full, 1.0, 0.5, 3.0).detail.startswith("memory and time target missed")
    assert verdict(10, 40, 1.0, full, 1.0, 0.5, 3.0).status == "PASS"  # a bound below the target confirms it
    row = verdict(10, 60, 1.0, full, 1.0, 0.5, 3.0)
    assert row.status == "FAIL" and row.detail.startswith("memory target not confirmed"), row.detail
    row = verdict(10, resident.UNKNOWN, 1.0, full, 1.0, 0.5, 3.0)
    assert row.status == "FAIL" and "peak at least" in row.detail, row.detail


def test_a_system_without_proc_is_not_measured_never_passed(monkeypatch):
    monkeypatch.setattr(resident, "available", lambda pid=None: False)
    row = check_systems(None, L)
    assert row.status == NOT_MEASURED and "--no-systems" in row.detail, row.detail


def test_no_systems_row_when_skipped_or_when_the_pair_fails_and_a_skip_is_said():
    report = check_file(SOLUTION, systems_size=None)
    assert FUNCTION not in {r.function for r in report.rows}
    assert report.skipped == SKIPPED and SKIPPED in report.summary()
    wrong = STUDENTS / "flash_no_scale.py"
    report = check_file(wrong, systems_size=L)
    assert FUNCTION not in {r.function for r in report.rows} and not report.skipped


def test_check_no_systems_flag_skips_the_stage_and_says_so(tmp_path):
    cmd = [sys.executable, "-m", "mha_numpy", "check", str(SOLUTION), "--no-systems"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert FUNCTION not in r.stdout and "systems stage skipped (--no-systems)" in r.stdout, r.stdout
    assert "not passed" in r.stdout.splitlines()[-1], r.stdout


def test_the_targets_the_exercise_and_the_course_state_are_the_checkers():
    import json

    from mha_numpy.checker.systems import MEMORY_FRACTION, SIZE, TIME_RATIO

    cells = json.loads((ROOT / "exercises" / "ex13_flash_backward.ipynb").read_text(encoding="utf-8"))["cells"]
    text = "".join(next(c for c in cells if c.get("id") == "systems-targets")["source"])
    assert f"$L_q = L_k = {SIZE}$" in text and "from outside" in text and "tracemalloc" not in text, text
    assert f"peak < {MEMORY_FRACTION:g} × one $(L, L)$ array" in text and f"at most {TIME_RATIO:g} ×" in text, text
    course = " ".join((ROOT / "docs" / "course.md").read_text(encoding="utf-8").split())
    assert f"at L = {SIZE}" in course and f"< {MEMORY_FRACTION:g} of one (L, L) array" in course
    assert f"time ≤ {TIME_RATIO:g}× the library's" in course and "measured by the checker's process" in course
