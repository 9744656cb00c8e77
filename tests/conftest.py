"""Shared test set-up: strict mode under CI, and the fixtures every test file uses.

Under CI (environment variable CI set, as .ci/run does) a skipped test is turned into a failure:
CI installs everything in requirements-dev.txt, so a skip there means a check silently did not run.
Locally, tests that need torch or transformers skip with a reason when those are absent.
"""

from __future__ import annotations

import os

import matplotlib
import numpy as np
import pytest

matplotlib.use("Agg")

STRICT = bool(os.environ.get("CI")) or bool(os.environ.get("MHA_NUMPY_NO_SKIP"))

# Mask kinds of the test matrix (see make_mask); every kernel is checked on each.
MASK_KINDS = ["none", "padding", "causal", "bool", "additive", "additive+padding", "fully masked rows", "finite min"]


def make_mask(kind: str, rng: np.random.Generator, B: int, H: int, Lq: int, Lk: int):
    """A mask of ``kind`` for scores (B, H, Lq, Lk), in mha_numpy's convention (bool True = may attend)."""
    from mha_numpy import masks  # noqa: PLC0415 - keep conftest importable before the package is

    lengths = np.array([Lk] + [max(1, Lk - 2)] * (B - 1))
    blocked_rows = np.isin(np.arange(Lq), [1, Lq - 1])[None, None, :, None]  # queries 1 and Lq-1 see nothing
    fully = np.ones((B, 1, Lq, Lk), bool) & ~blocked_rows
    if B > 1:
        fully[-1] = False  # the last batch item has no key at all
    return {
        "none": None,
        "padding": masks.padding_mask(lengths, Lk),  # (B, 1, 1, Lk)
        "causal": masks.causal_mask(Lq, Lk),  # (Lq, Lk)
        "bool": np.concatenate([np.ones((B, 1, Lq, 1), bool), rng.random((B, 1, Lq, Lk - 1)) < 0.6], axis=-1),
        "additive": rng.normal(0, 2, (B, H, Lq, Lk)),
        "additive+padding": masks.combine_masks(rng.normal(0, 2, (Lq, Lk)), masks.padding_mask(lengths, Lk)),
        "fully masked rows": fully,
        # Hugging Face's "minus infinity": finfo.min, finite, on a padded batch and one fully blocked row
        "finite min": np.where(fully, 0.0, np.finfo(np.float64).min),
    }[kind]


@pytest.fixture
def rng():
    return np.random.default_rng(0)


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
