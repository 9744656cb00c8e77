"""scripts/code_figures.py counts what its docstring says, checked on a small package written here whose figures are
known by construction (the live tree's numbers move with every commit; the counting rules do not)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "code_figures.py"


def function(name: str, lines: int, indent: str = "", doc: bool = False) -> str:
    """A function ``lines`` long from its def line to its last line."""
    body = [f'{indent}    """Doc."""'] if doc else []
    body += [f"{indent}    x = 1"] * (lines - 1 - len(body))
    return "\n".join([f"{indent}def {name}():", *body]) + "\n"


SUB_MOD = '''
class Pub:
    def __init__(self):
        pass

    def run(self):
        pass

    def _hidden(self):
        pass

    class Inner:
        """Doc."""


class _Priv:
    def run(self):
        pass


if True:

    def in_if():
        pass


def empty_doc():
    """"""


def late_string():
    x = 1
    "not a docstring"
    return x


async def documented_async():
    """Doc."""


def outer_doc():
    """Doc."""

    def inner():
        pass

    return inner
'''


def make_package(root: Path) -> Path:
    """pkg/: 19 public definitions, 12 without a docstring; 5 long functions in its wing; one file over 300 lines."""
    pkg = root / "pkg"
    files = {
        # public: documented, bare (undocumented)
        "__init__.py": '"""The package."""\n\n\ndef documented():\n    """Says so."""\n\n\ndef bare():\n    return 1\n',
        # wing; public: exact40, decorated, long41, Module (documented), Module.method, outer; 5 undocumented
        "attention.py": "def _deco(f):\n    return f\n\n\n"
        + function("exact40", 40)  # 40 lines: not over
        + "\n\n@_deco\n@_deco\n"
        + function("decorated", 40)  # 42 with its decorators, which do not count
        + "\n\n"
        + function("long41", 41)
        + '\n\nclass Module:\n    """Doc."""\n\n'
        + function("method", 45, indent="    ")
        + "\n\ndef outer():\n"  # 1 + 41 lines: over, and so is inner
        + function("inner", 41, indent="    "),
        "latent_cache.py": function("latent_long", 41),  # the wing's latent*.py; public, undocumented
        "other.py": function("other_long", 50, doc=True),  # not the wing; public, documented
        "sub/__init__.py": "",
        "sub/attention.py": function("deep", 50, doc=True),  # not at the package's top: not the wing
        "sub/mod.py": SUB_MOD,  # public: Pub, Pub.run, Pub.Inner, in_if, empty_doc, late_string, documented_async,
        # outer_doc; undocumented: Pub, Pub.run, in_if, empty_doc, late_string
        "_private.py": "def helper():\n    pass\n",  # a private module: not counted
        "_sub/__init__.py": "def hidden():\n    pass\n",  # a private package: not counted
        "_sub/mod.py": "def also_hidden():\n    pass\n",
        "big.py": '"""Big."""\n' + "x = 1\n" * 300,  # 301 lines: over
        "edge.py": '"""Edge."""\n' + "x = 1\n" * 299,  # 300 lines: not over
    }
    for name, text in files.items():
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        (pkg / name).write_text(text)
    compile_all = [compile(p.read_text(), str(p), "exec") for p in pkg.rglob("*.py")]  # valid Python, all of it
    assert len(compile_all) == len(files)
    return pkg


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=ROOT)


def test_the_figures_of_a_package_built_to_known_counts(tmp_path):
    r = run("--package", str(make_package(tmp_path)), "--json")
    assert r.returncode == 0, r.stderr
    f = json.loads(r.stdout)
    long = {(x["file"], x["function"], x["lines"]) for x in f["wing_functions_over_40"]}
    assert long == {
        ("pkg/attention.py", "long41", 41),
        ("pkg/attention.py", "Module.method", 45),
        ("pkg/attention.py", "outer", 42),
        ("pkg/attention.py", "outer.<locals>.inner", 41),
        ("pkg/latent_cache.py", "latent_long", 41),
    }
    assert f["files_over_300"] == [{"file": "pkg/big.py", "lines": 301}]
    assert (f["public"], f["public_undocumented"]) == (19, 12)
    assert f["undocumented_share"] == 12 / 19
    names = sorted(entry.split(" ", 1)[1] for entry in f["undocumented"])
    assert names == sorted(
        ["bare", "exact40", "decorated", "long41", "Module.method", "outer", "latent_long"]
        + ["Pub", "Pub.run", "in_if", "empty_doc", "late_string"]
    )


def test_the_table_and_the_usage_error(tmp_path):
    r = run("--package", str(make_package(tmp_path)), "--list")
    assert r.returncode == 0, r.stderr
    assert "| public functions/methods/classes without a docstring | 12 of 19 (63.2 %) | ≤ 15 % |" in r.stdout
    assert "| files over 300 lines in pkg/ | 1 | ≤ 20 |" in r.stdout
    assert "    45  pkg/attention.py  Module.method" in r.stdout
    assert "pkg/sub/mod.py:" in r.stdout and " late_string" in r.stdout
    live = run()  # the default package runs (its numbers are the docs' business, not this test's)
    assert live.returncode == 0 and "files over 300 lines in mha_numpy/" in live.stdout, live.stderr
    missing = run("--package", str(tmp_path / "nowhere"))
    assert missing.returncode == 2 and "is not a directory" in missing.stderr and "Traceback" not in missing.stderr
