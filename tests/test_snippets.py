"""Every Python snippet of the README and of docs/*.md runs, as a reader would paste it.

Each ```python block (at any indentation) is executed in order, the blocks of one file sharing one namespace (a
page builds on its earlier blocks), in a temporary working directory (snippets that write figures write them
there). A ```pycon block or a block of ``>>>`` lines is a doctest: it must print what it shows.

A block that cannot run here (it needs a GPU, a download, your own model) says so on the line just before it:

    <!-- snippet: no-run (the reason) -->

The test fails on a marker without a reason. Keep such markers few: a snippet nobody runs drifts away from the API
(docs/course.md's "Figures for slides" raised a TypeError). New pages are picked up by the glob.

A snippet may use names its page's prose defines ("for any attention arrays", "your kernel"): ``PRELUDES`` below
gives them small real values, per page, before its first block, as Sphinx's ``testsetup`` does.
"""

from __future__ import annotations

import doctest
import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<lang>[\w-]*)[^\n]*\n(?P<body>.*?)^(?P=indent)```[ \t]*$", re.M | re.S)
MARKER = re.compile(r"<!--\s*snippet:\s*no-run\s*(?:\((?P<reason>[^)]*)\))?\s*-->\s*$")


def blocks(page: Path):
    """(line number, kind, source, reason-or-None) for each python/pycon block of a page, in order."""
    text = page.read_text(encoding="utf-8")
    for m in FENCE.finditer(text):
        lang, body, indent = m["lang"], m["body"], m["indent"]
        doctest_like = lang == "pycon" or (lang in ("python", "") and body.lstrip().startswith(">>>"))
        if lang != "python" and not doctest_like:
            continue
        source = "\n".join(line[len(indent) :] if line.startswith(indent) else line for line in body.splitlines())
        line = text.count("\n", 0, m.start()) + 1
        before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = MARKER.search(before)
        reason = None if marker is None else (marker["reason"] or "").strip()
        yield line, "doctest" if doctest_like else "python", source, reason


# page -> code run first in its namespace: the names its prose defines, as small real values
PRELUDES = {
    "docs/course.md": """
import shutil
import numpy as np
from mha_numpy import MultiHeadAttention
shutil.copy(ROOT / "exercises" / "solutions" / "ex05_softmax.py", "my_attention.py")  # the student's file
x = np.random.default_rng(0).standard_normal((1, 4, 8))
_, cache = MultiHeadAttention(8, 2, rng=0).forward(x, x, x)
weights, tokens = cache.attn_weights, ["the", "cat", "sat", "."]
""",
    "docs/crosscheck.md": """
import numpy as np
rng = np.random.default_rng(0)
query, key, value = rng.standard_normal((2, 3, 16)), rng.standard_normal((2, 5, 6)), rng.standard_normal((2, 5, 7))
kpm = np.array([[False] * 5, [False, False, False, True, True]])  # torch's key_padding_mask, True = ignore
am = np.triu(np.ones((3, 5), dtype=bool), k=4)  # torch's attn_mask, True = ignore (the last key for query 0)
""",
    "docs/explorer.md": """
import numpy as np
from mha_numpy import MultiHeadAttention, masks
from mha_numpy.bert import BertModel
from mha_numpy.functional import alibi_bias
from mha_numpy.train import train
x = np.random.default_rng(0).standard_normal((1, 4, 8))
mask = masks.causal_mask(4)
mha = MultiHeadAttention(8, 2, rng=0)
_, cache = mha.forward(x, x, x, mask=mask)
model = BertModel.from_pretrained(dtype=np.float32)
result = train("reverse", steps=2, length=4)
ids, tokens = np.array([3, 1, 4, 1]), ["the", "cat", "sat", "."]
attentions, Q, K = [cache.attn_weights[0]], cache.Q[0], cache.K[0]
alibi = np.zeros((2, 4, 4))  # a score term; zero keeps attentions the softmax of the scores
""",
    # n/a on every case (NotImplementedError): here the snippets' API is tested; the matrix, in tests/test_verify*.py
    "docs/verify.md": """
def my_attention(q, k, v, mask=None, scale=None):
    raise NotImplementedError
""",
}

PAGES_WITH_SNIPPETS = [p for p in PAGES if any(True for _ in blocks(p))]


def test_every_no_run_marker_gives_a_reason_and_they_are_few():
    marked = [(p.name, line, reason) for p in PAGES for line, _, _, reason in blocks(p) if reason is not None]
    assert all(reason for _, _, reason in marked), f"a no-run marker without (the reason): {marked}"
    total = sum(1 for p in PAGES for _ in blocks(p))
    assert len(marked) <= max(3, total // 10), f"too many snippets not run: {marked}"


@pytest.mark.parametrize("page", PAGES_WITH_SNIPPETS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_snippets_run(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    namespace: dict = {"__name__": "__snippet__", "ROOT": ROOT}
    exec(PRELUDES.get(page.relative_to(ROOT).as_posix(), ""), namespace)  # noqa: S102
    for line, kind, source, reason in blocks(page):
        if reason is not None:
            continue
        where = f"{page.relative_to(ROOT)}:{line}"
        if kind == "doctest":
            test = doctest.DocTestParser().get_doctest(source, namespace, where, str(page), line)
            runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
            report: list[str] = []
            if runner.run(test, out=report.append).failed:
                pytest.fail(f"{where}: the doctest printed otherwise\n{''.join(report)}", pytrace=False)
            namespace.update(test.globs)
            continue
        try:
            exec(compile(source, where, "exec"), namespace)  # noqa: S102 - the documentation's own code
        except Exception as e:  # name the snippet, not this line
            pytest.fail(f"{where}: {type(e).__name__}: {e}", pytrace=False)
    assert os.getcwd() == str(tmp_path)
