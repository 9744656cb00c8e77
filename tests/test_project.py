"""Project hygiene: lint and format clean, torch never imported by the package at import time,
and CI runs exactly the README's test command."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def ruff():
    exe = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    if not Path(exe).exists():
        pytest.skip("ruff is not installed: pip install -r requirements-dev.txt")
    return exe


def test_ruff_check_is_clean():
    r = subprocess.run([ruff(), "check", "."], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_ruff_format_is_clean():
    r = subprocess.run([ruff(), "format", "--check", "."], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_import_does_not_pull_torch_transformers_or_matplotlib():
    code = (
        "import sys, mha_numpy, mha_numpy.__main__\n"
        "bad = [m for m in ('torch', 'transformers', 'matplotlib') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_no_module_level_torch_import_in_the_package():
    for path in (ROOT / "mha_numpy").rglob("*.py"):
        for line in path.read_text().splitlines():
            if line.startswith(("import torch", "from torch", "import transformers", "from transformers")):
                pytest.fail(f"{path.relative_to(ROOT)} imports torch/transformers at module level: {line}")


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "pip install -r requirements-dev.txt && python -m pytest" in readme
    assert "README.md" in ci and "requirements-dev" in ci
    assert "torch==2.13.0" in (ROOT / "requirements-dev.txt").read_text()
