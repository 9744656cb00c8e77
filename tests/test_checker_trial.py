"""The checker on a hidden trial set (tests/data/students/trial2): right verdicts on all, every bug located, at least
nine bugs in ten named with the right relation or catalogue entry.

Each file's header says what a good checker must report, decided from the bug's nature (scripts/measure_checker.py
reads it): correct files in unusual styles (c*), near-variants of catalogued bugs (n*), bugs outside the catalogue
(o*), hostile files (h*). The checker runs once per session on the whole set (two files at a time, about two minutes:
the correct FlashAttention file also runs exercise 13's memory and time check), shared by the xdist workers through a
file in pytest's base temporary directory. A gap of today's checker is an ``xfail(strict=True)`` naming it, so the fix
that closes it turns the case into a failure until its mark is removed.

A second set, trial3, written after the checker was fixed on trial2 and never used to tune it, is tested the same
way at the end of this file, its naming per bug as well as a rate.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TRIAL = ROOT / "tests" / "data" / "students" / "trial2"
SCRIPT = ROOT / "scripts" / "measure_checker.py"
WAIT = 1800  # seconds a worker waits for the one measuring the set: far above its few minutes
NAMED_AT_LEAST = 0.90


def _script():
    spec = importlib.util.spec_from_file_location("measure_checker", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


M = _script()
FILES = sorted(TRIAL.glob("*.py"))
HEADERS = {p.name: M.read_header(p) for p in FILES}
BUGS = [name for name, h in HEADERS.items() if h.bug]

# the gaps of the checker on main when the set was written (scripts/measure_checker.py's table, in the report)
VERDICT_GAPS: dict[str, str] = {}
LOCATION_GAPS: dict[str, str] = {}


def _mark(names, gaps):
    return [pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=gaps[n])) if n in gaps else n for n in names]


def _summaries(results) -> dict:
    lines = M.table(results).splitlines()
    return {
        "table": "\n".join(lines),
        "files": {
            r.path.name: {"verdict": r.verdict_ok, "located": r.located_ok, "named": r.named_ok, "line": line}
            for r, line in zip(results, lines[1:])
        },
    }


def _measured_once(tmp_path_factory, folder: Path) -> dict:
    """The measurement of the whole set in ``folder``, made by the first worker that asks and read by the others."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # the session's, across workers
    done, lock = shared / f"{folder.name}-measured.json", shared / f"{folder.name}-measured.lock"
    try:
        os.close(os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        deadline = time.monotonic() + WAIT
        while not done.exists():
            assert time.monotonic() < deadline, f"no measurement of the trial set after {WAIT} s"
            time.sleep(1)
        data = json.loads(done.read_text(encoding="utf-8"))
    else:
        try:
            data = _summaries(M.measure(folder, jobs=2, timeout=10.0))
        except Exception as e:
            data = {"error": f"{type(e).__name__}: {e}"}
        partial = done.with_suffix(".part")
        partial.write_text(json.dumps(data), encoding="utf-8")
        partial.replace(done)
    assert "error" not in data, data.get("error")
    return data


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> dict:
    return _measured_once(tmp_path_factory, TRIAL)


@pytest.mark.slow
@pytest.mark.parametrize("name", _mark(list(HEADERS), VERDICT_GAPS))
def test_the_verdict_on_every_trial_file_is_right(measured, name):
    assert measured["files"][name]["verdict"], measured["files"][name]["line"]


@pytest.mark.slow
@pytest.mark.parametrize("name", _mark(BUGS, LOCATION_GAPS))
def test_every_bug_of_the_trial_set_is_located(measured, name):
    """The first FAIL row is the function of the bug, at the gradient (or capstone F-line) the header names."""
    assert measured["files"][name]["located"], measured["files"][name]["line"]


@pytest.mark.slow
def test_at_least_nine_bugs_in_ten_are_named(measured):
    named = sum(bool(measured["files"][n]["named"]) for n in BUGS)
    assert named >= NAMED_AT_LEAST * len(BUGS), f"{named} / {len(BUGS)} named\n{measured['table']}"


def test_the_trial_set_has_each_kind_of_file_and_every_bug_says_where_and_what():
    kinds = {kind: [n for n in HEADERS if n.startswith(kind)] for kind in "cnoh"}
    assert [len(kinds[k]) >= least for k, least in zip("cnoh", (8, 14, 15, 8))] == [True] * 4, kinds
    assert all(HEADERS[n].expect == "PASS" and not HEADERS[n].hostile for n in kinds["c"])
    assert all(HEADERS[n].hostile for n in kinds["h"])
    for name in BUGS:
        assert HEADERS[name].where and HEADERS[name].names, name


REPORT = """\
attention_scores_forward   PASS
attention_scores_backward  FAIL  dk (2, 2, 5, 4): worst at (1, 1, 3, 1), got 1, expected 2 [case q]
                           relation: dk (in attention_scores_backward) is 1/√d (= 0.5) times the right one (too small): a factor √d is missing where it is computed.
softmax_backward  FAIL  dx (2, 2, 3, 5): worst at (0, 0, 0, 1) [case x]
                  diagnosis: The softmax backward sums over the wrong axis. You probably wrote ...
1 of 3 functions pass
"""  # noqa: E501 - a report's relation line is as long as it is


def test_the_measure_reads_a_report_as_the_headers_mean_it():
    """Location needs the first FAIL row at the gradient named; a factor needs its label; a catalogue entry its
    title; a sentence of another kind or row is not a name."""
    rows = M.parse_report(REPORT)
    assert [(r.function, r.status) for r in rows] == [
        ("attention_scores_forward", "PASS"),
        ("attention_scores_backward", "FAIL"),
        ("softmax_backward", "FAIL"),
    ]
    titles = M.catalogue_titles()

    def judged(expect_where: str, name: str):
        header = M.Header("FAIL", expect_where.split(), [name])
        result = M.Result(Path("x.py"), header, 1, rows)
        return M.located(result), M.named(result, titles)

    assert judged("attention_scores_backward dk", "relation factor √d") == (True, True)
    assert judged("attention_scores_backward dk", "relation factor the number of heads") == (True, False)
    assert judged("attention_scores_backward dq", "relation transpose") == (False, False)
    assert judged("softmax_backward x", "catalogue softmax_wrong_axis") == (False, True)  # not the first FAIL row
    assert judged("softmax_backward x", "catalogue softmax_diagonal") == (False, False)
    axes = "dx (in merge_heads_backward) has its axes (2, 3) swapped: put them back in the forward's order."
    assert [k for k, words in M.KINDS.items() if M.re.search(words, axes)] == ["transpose"]  # not "order" too
    said = {  # trial3's right relations in words the measure first did not read, each read as its kind only
        "dW (in linear_backward) has the right values in other places (the same entries, moved): a reshape where a "
        "transpose belongs": "transpose",
        "dtable (in embedding_backward) is wrong only on the rows of ids that occur more than once": "part",
        "dg (in delta_rule_recurrent_backward) is the right one divided by a_t = exp(g_t), entry by entry": "factor",
    }
    for sentence, kind in said.items():
        assert [k for k in ("transpose", "part", "factor") if M.re.search(M.KINDS[k], sentence)] == [kind], sentence
    assert M.Result(Path("x.py"), M.Header("FAIL"), 1, rows).verdict == "FAIL"
    assert M.Result(Path("x.py"), M.Header("PASS"), 0, rows[:1]).verdict == "PASS"
    assert M.Result(Path("x.py"), M.Header("FAIL"), 1, []).verdict.startswith("error")  # the checker's traceback
    assert M.Result(Path("x.py"), M.Header("FAIL"), None, rows).verdict.startswith("error")  # no verdict in time


@pytest.mark.parametrize(
    "argv",
    [["/no/such/folder"], [str(TRIAL), "--jobs", "0"], [], [str(TRIAL), "--out", "/no/such/dir/table.txt"]],
    ids=["no folder", "jobs 0", "no argument", "out in no directory"],
)
def test_a_usage_mistake_is_one_line_and_exit_code_2(argv):
    r = subprocess.run([sys.executable, str(SCRIPT), *argv], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stdout == "" and len(r.stderr.strip().splitlines()) == 1, r.stderr


# --------------------------------------------------------------------------------------------------------------------
# trial3: a second hidden set (tests/data/students/trial3), written after the checker was fixed on trial2 and never
# used to tune it: c* correct in unusual styles, n* near-variants, o* bugs outside the catalogue, h* hostile. Its gaps
# below are the checker's (and the measure's reading of it) on main when the set was written, each with what it said.
TRIAL3 = ROOT / "tests" / "data" / "students" / "trial3"
HEADERS3 = {p.name: M.read_header(p) for p in sorted(TRIAL3.glob("*.py"))}
BUGS3 = [name for name, h in HEADERS3.items() if h.bug]
VERDICT_GAPS3: dict[str, str] = {}
LOCATION_GAPS3: dict[str, str] = {}
NAMING_GAPS3 = {  # when the set was written, 22 of 33 were named; 7 more were right in words the measure did not read
    # no relation
    "o03_delta_states_aliased.py": "dq: worst at ..., got -0.461129, expected -3.36319 (no relation: every cached "
    "state is the same array, overwritten)",
}
# Named of 33 untuned: 22 as the set was written, 29 once the measure read seven right sentences; then the relations
# it lacked (a path through its weight transposed, the mirrored distance, repeat_kv's other grouping) made it 32.


@pytest.fixture(scope="module")
def measured3(tmp_path_factory) -> dict:
    return _measured_once(tmp_path_factory, TRIAL3)


@pytest.mark.slow
@pytest.mark.parametrize("name", _mark(list(HEADERS3), VERDICT_GAPS3))
def test_the_verdict_on_every_trial3_file_is_right(measured3, name):
    assert measured3["files"][name]["verdict"], measured3["files"][name]["line"]


@pytest.mark.slow
@pytest.mark.parametrize("name", _mark(BUGS3, LOCATION_GAPS3))
def test_every_bug_of_trial3_is_located(measured3, name):
    assert measured3["files"][name]["located"], measured3["files"][name]["line"]


@pytest.mark.slow
@pytest.mark.parametrize("name", _mark(BUGS3, NAMING_GAPS3))
def test_every_bug_of_trial3_is_named(measured3, name):
    """One case per bug, so that each gap is visible and the fix that closes it flips its mark."""
    assert measured3["files"][name]["named"], measured3["files"][name]["line"]


@pytest.mark.slow
def test_at_least_nine_bugs_in_ten_of_trial3_are_named(measured3):
    named = sum(bool(measured3["files"][n]["named"]) for n in BUGS3)
    assert named >= NAMED_AT_LEAST * len(BUGS3), f"{named} / {len(BUGS3)} named\n{measured3['table']}"


def test_trial3_has_each_kind_of_file_and_every_bug_says_where_and_what():
    kinds = {kind: [n for n in HEADERS3 if n.startswith(kind)] for kind in "cnoh"}
    assert [len(kinds[k]) >= least for k, least in zip("cnoh", (8, 16, 17, 4))] == [True] * 4, kinds
    assert all(HEADERS3[n].expect == "PASS" and not HEADERS3[n].hostile for n in kinds["c"])
    assert all(HEADERS3[n].hostile for n in kinds["h"])
    assert set(NAMING_GAPS3) <= set(BUGS3) and len(BUGS3) == 33
    for name in BUGS3:
        assert HEADERS3[name].where and HEADERS3[name].names, name
