"""Shared test set-up.

Under CI (environment variable CI set, as .ci/run does) a skipped test is turned into a failure:
CI installs everything in requirements-dev.txt, so a skip there means a check silently did not run.
Locally, tests that need torch or transformers skip with a reason when those are absent.
"""

from __future__ import annotations

import os

import matplotlib
import pytest

matplotlib.use("Agg")

STRICT = bool(os.environ.get("CI")) or bool(os.environ.get("MHA_NUMPY_NO_SKIP"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if STRICT and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped under CI, where every check must run: {reason}"


def pytest_report_header(config):
    return f"mha_numpy strict mode (skips fail): {STRICT}"
