"""The documentation site builds with ``mkdocs build --strict`` (a broken link, a missing page or a docstring
reference that does not resolve fails it), and holds the README as home, the API, notebooks and explorer."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_mkdocs_build_strict(tmp_path):
    for module in ("mkdocs", "material", "mkdocstrings", "mkdocs_jupyter"):
        pytest.importorskip(module, reason=f"{module} is not installed: pip install -r requirements-dev.txt")
    site = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    run = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    home = (site / "index.html").read_text(encoding="utf-8")
    assert "mha_numpy" in home and 'href="masks/"' in home  # README's docs/masks.md link, rewritten for the site
    assert "linear_backward" in (site / "api" / "index.html").read_text(encoding="utf-8")
    notebooks = sorted(p.name for p in (site / "notebooks").iterdir())
    assert notebooks == sorted(p.stem for p in (ROOT / "notebooks").glob("*.ipynb"))
    nb = (site / "notebooks" / notebooks[0] / "index.html").read_text(encoding="utf-8")
    assert "data:image/png;base64" in nb  # rendered with its committed outputs
    explorer = site / "explorer" / "bert.html"
    assert explorer.stat().st_size < 2_000_000
    assert "[CLS]" in explorer.read_text(encoding="utf-8")
    assert 'src="bert.html"' in (site / "explorer" / "index.html").read_text(encoding="utf-8")
    assert not (ROOT / ".cache").exists()  # the build leaves nothing in the repository
