"""The documentation site builds with ``mkdocs build --strict`` (a broken link, a missing page or a docstring
reference that does not resolve fails it), and holds the README as home, the API, notebooks and explorer; its
maths render in Chromium with the site's own MathJax; no list of README.md or docs/*.md collapses into a paragraph."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# a list marker at the start of a line inside a rendered paragraph: the list was not seen as a list
LIST_IN_TEXT = re.compile(r"(?:^|\n)[ \t]*(?:[-*+]|\d+[.)])[ \t]+\S")


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site, built once for this module."""
    for module in ("mkdocs", "material", "mkdocstrings", "mkdocs_jupyter"):
        pytest.importorskip(module, reason=f"{module} is not installed: pip install -r requirements-dev.txt")
    site = tmp_path_factory.mktemp("docs") / "site"
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
    return site


@pytest.mark.slow
def test_mkdocs_build_strict(site):
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


def markdown_of_the_site():
    """Python-Markdown with mkdocs.yml's extensions and their options, as the site renders a page."""
    markdown = pytest.importorskip("markdown", reason="markdown is not installed: pip install -r requirements-dev.txt")
    yaml = pytest.importorskip("yaml", reason="pyyaml is not installed: pip install -r requirements-dev.txt")
    names, options = [], {}
    for ext in yaml.safe_load((ROOT / "mkdocs.yml").read_text())["markdown_extensions"]:
        name, opts = next(iter(ext.items())) if isinstance(ext, dict) else (ext, None)
        names.append(name)
        options[name] = opts or {}
    return markdown.Markdown(extensions=names, extension_configs=options)


def test_no_list_collapses_into_a_paragraph():
    """Python-Markdown needs a blank line before a list (and after a fenced block inside an item): without one the
    items become lines of the paragraph before them (README's "It is for" list, crosscheck.md's Llama notes)."""
    md = markdown_of_the_site()
    collapsed = []
    for page in PAGES:
        html = md.reset().convert(page.read_text(encoding="utf-8"))
        html = re.sub(r"<(pre|code)\b.*?</\1>", "", html, flags=re.S)  # code may start a line with "- "
        html = re.sub(r'<(span|div) class="arithmatex">.*?</\1>', "", html, flags=re.S)  # so may maths
        for para in re.finditer(r"<(p|li)>(.*?)</\1>", html, flags=re.S):
            for hit in LIST_IN_TEXT.finditer(para[2]):
                collapsed.append(f"{page.relative_to(ROOT)}: ...{para[2][max(0, hit.start() - 60) : hit.end() + 20]!r}")
    assert not collapsed, "a list without a blank line before it:\n" + "\n".join(collapsed)


@pytest.mark.slow
def test_maths_render_in_chromium_from_the_site_itself(site):
    """Every formula of the derivation is typeset by MathJax (its mjx-container, no merror), no raw $$ or \\[ is
    left in the text, and the page loads nothing but the site's own files (MathJax and its fonts included)."""
    from browser import Browser, console_errors, requested_urls

    browser = Browser()
    try:
        d = browser.driver
        for page in ("derivation", "course"):
            browser.open(site / page / "index.html")
            count = "return document.querySelectorAll('.arithmatex').length"
            done = "return document.querySelectorAll('.arithmatex mjx-container').length"
            formulas = d.execute_script(count)
            deadline = time.monotonic() + 60
            while d.execute_script(done) < formulas and time.monotonic() < deadline:
                time.sleep(0.2)
            assert formulas > 10 and d.execute_script(done) == formulas, (page, formulas, d.execute_script(done))
            assert d.execute_script("return document.querySelectorAll('mjx-merror').length") == 0
            text = d.execute_script("return document.querySelector('article').innerText")
            assert "$$" not in text and "\\[" not in text and "\\begin{" not in text, page
            urls = requested_urls(d)
            assert [u for u in urls if not u.startswith(("file://", "data:"))] == [], page
            assert any(u.endswith("/mathjax/tex-chtml-full.js") and u.startswith(site.as_uri()) for u in urls)
            assert any(u.endswith(".woff") for u in urls), "MathJax's fonts, from the site"
            assert console_errors(d) == [], page
    finally:
        browser.close()
