"""Exercise 13's systems stage (checker.systems): peak memory measured in the student's child, time against the
library's chunked kernel. L = 2048 here (the stage's default is 4096) to stay fast; timing verdicts are tested
only with thresholds no run can miss or meet."""

from pathlib import Path

from mha_numpy.checker import check_file
from mha_numpy.checker.process import ChildProcess
from mha_numpy.checker.systems import FUNCTION, check_systems, verdict

ROOT = Path(__file__).resolve().parents[1]
SOLUTION = ROOT / "exercises" / "solutions" / "ex13_flash_backward.py"
FULL_MATRIX = ROOT / "tests" / "data" / "students" / "flash_full_matrix.py"
L = 2048


def test_solution_meets_the_memory_target_and_reports_its_time_ratio():
    with ChildProcess(SOLUTION, 60) as child:
        row = check_systems(child, L, time_ratio=1e9)
    assert row.status == "PASS", row.detail
    assert "memory target" not in row.detail
    assert "× the library's chunked kernel" in row.detail


def test_a_kernel_that_builds_the_full_matrix_fails_the_memory_target_named():
    report = check_file(FULL_MATRIX, systems_size=L)
    rows = {r.function: r for r in report.rows}
    assert rows["flash_attention_forward"].status == rows["flash_attention_backward"].status == "PASS"
    row = rows[FUNCTION]
    assert row.status == "FAIL"
    assert row.detail.startswith("memory target missed") or row.detail.startswith("memory and time target missed")
    peak_fraction = float(row.detail.split(" = ")[1].split()[0])
    assert peak_fraction >= 1.0, row.detail  # at least one whole (L, L) array, measured


def test_an_absurd_time_target_fails_named_and_memory_stays_separate():
    with ChildProcess(SOLUTION, 60) as child:
        row = check_systems(child, L, time_ratio=1e-9)
    assert row.status == "FAIL"
    assert row.detail.startswith("time target missed"), row.detail


def test_verdict_names_each_missed_target():
    full = 100
    assert verdict(10, 1.0, full, 1.0, 0.5, 3.0).status == "PASS"
    assert verdict(60, 1.0, full, 1.0, 0.5, 3.0).detail.startswith("memory target missed")
    assert verdict(10, 4.0, full, 1.0, 0.5, 3.0).detail.startswith("time target missed")
    assert verdict(60, 4.0, full, 1.0, 0.5, 3.0).detail.startswith("memory and time target missed")


def test_no_systems_row_when_not_asked_or_when_the_pair_fails():
    assert FUNCTION not in {r.function for r in check_file(SOLUTION, systems_size=None).rows}
    wrong = ROOT / "tests" / "data" / "students" / "flash_no_scale.py"
    assert FUNCTION not in {r.function for r in check_file(wrong, systems_size=L).rows}
