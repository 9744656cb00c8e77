"""Project hygiene: lint and format clean, torch never imported by the package at import time,
and CI runs exactly the README's test command."""

from __future__ import annotations

import os
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
    assert "pip install -r requirements-dev.txt && python -m pytest -n 2" in readme
    assert "README.md" in ci and "requirements-dev" in ci
    assert "torch==2.13.0" in (ROOT / "requirements-dev.txt").read_text()


def test_ci_turns_a_skip_into_a_failure(tmp_path):
    """Under CI=true a skipped test (e.g. torch missing) must fail the run, not pass silently."""
    shutil.copy(ROOT / "tests" / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_skips.py").write_text(
        "import pytest\n\ndef test_x():\n    pytest.skip('torch is not installed')\n"
    )
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)]
    base = {k: v for k, v in os.environ.items() if k not in ("CI", "MHA_NUMPY_NO_SKIP")}
    strict = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, env={**base, "CI": "true"})
    assert strict.returncode == 1 and "skipped under CI" in strict.stdout, strict.stdout
    local = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, env=base)
    assert local.returncode == 0 and "1 skipped" in local.stdout, local.stdout


def import_graph() -> dict[str, set[str]]:
    """mha_numpy module -> the mha_numpy modules it imports, anywhere in the file (lazy imports counted)."""
    import ast

    pkg = ROOT / "mha_numpy"
    graph: dict[str, set[str]] = {}
    for path in pkg.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        package = name if parts[-1] == "__init__" else name.rsplit(".", 1)[0]
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = package.split(".")
                base = base[: len(base) - node.level + 1] if node.level else []
                mod = ".".join(base + ([node.module] if node.module else []))
                deps |= {f"{mod}.{a.name}" for a in node.names} | {mod}
            elif isinstance(node, ast.Import):
                deps |= {a.name for a in node.names}
        modules = {p.relative_to(ROOT).with_suffix("").as_posix().replace("/", ".").removesuffix(".__init__")
                   for p in pkg.rglob("*.py")}  # fmt: skip
        graph[name] = {d for d in deps if d in modules and d != name and not name.startswith(d + ".")}
    return graph


def test_import_graph_is_one_way():
    """The layering of docs/architecture.md: no cycle (lazy imports counted), functional imports only
    _checks, no kernel imports attention, nothing below commands imports commands."""
    graph = import_graph()
    assert graph["mha_numpy.functional"] <= {"mha_numpy._checks"}
    for name, deps in graph.items():
        if name.startswith("mha_numpy.kernels"):
            assert "mha_numpy.attention" not in deps, name
        if not name.startswith("mha_numpy.commands") and name != "mha_numpy.__main__":
            assert not any(d.startswith("mha_numpy.commands") for d in deps), name
    state: dict[str, int] = {}

    def visit(node, path):
        state[node] = 1
        for dep in graph.get(node, ()):
            assert state.get(dep) != 1, " -> ".join([*path, node, dep])
            if dep not in state:
                visit(dep, [*path, node])
        state[node] = 2

    for node in graph:
        if node not in state:
            visit(node, [])


def test_no_module_imports_a_private_name_of_another_module():
    """A leading underscore means "this module's own": importing such a name from another module is a defect
    (checker/gallery.py imported runner's _array and _finite; models/bert.py bert_files' _read_safetensors), and a
    private module (``kernels/_threads.py`` once, ``viz/_layout.py``) is its package's own: importing it from
    outside that package is one too. ``mha_numpy/_checks.py`` and ``_optional.py`` belong to the whole package."""
    import ast

    found = []
    for path in (ROOT / "mha_numpy").rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        package = name if parts[-1] == "__init__" else name.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom):
                continue
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            if not module.startswith("mha_numpy"):
                continue
            found += [f"{name}: {a.name} from {module}" for a in node.names if a.name.startswith("_")
                      and not a.name.endswith("__")]  # fmt: skip
            owner, _, last = module.rpartition(".")
            if last.startswith("_") and not last.endswith("__") and not (name + ".").startswith(owner + "."):
                found.append(f"{name}: the private module {module}")
    assert not found, found


def test_every_optional_package_has_an_extra_and_all_installs_them():
    """pip install '.[all]' runs every command; each optional import names an extra that really brings it."""
    import re

    import tomllib

    from mha_numpy._optional import EXTRAS

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for module, (pip_name, extra) in EXTRAS.items():
        names = [re.split(r"[<>=\[ ]", req)[0] for req in extras[extra]]
        assert pip_name in names, f"{module}: {pip_name} is not in the extra [{extra}] = {extras[extra]}"
    assert extras["all"] == [f"mha_numpy[{','.join(e for e in extras if e != 'all')}]"]
    dev = "".join(p.read_text() for p in ROOT.glob("requirements*.txt"))  # -dev includes the others
    for reqs in extras.values():  # what an extra pins, the dev install (what the tests run on) has too
        for req in reqs:
            if not req.startswith("mha_numpy"):
                assert re.split(r"[<>=]", req)[0] in dev, req


def test_a_missing_optional_package_names_its_extra(monkeypatch):
    from mha_numpy._optional import MissingDependency, require

    monkeypatch.setitem(sys.modules, "tokenizers", None)  # import now fails as if not installed
    with pytest.raises(MissingDependency, match=r"pip install 'mha_numpy\[bert\]'"):
        require("tokenizers", "tokenizing")
    assert issubclass(MissingDependency, ModuleNotFoundError)  # `except ImportError` still catches it


def test_a_quick_benchmark_run_never_targets_the_committed_results(capsys):
    """Issue 11: bench_attention.py --quick overwrote benchmarks/results.*; scratch runs go to out/bench/."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_attention", ROOT / "benchmarks" / "bench_attention.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.parse_args(["--quick"]).out == ROOT / "out" / "bench"
    assert bench.parse_args([]).out == ROOT / "out" / "bench"
    assert bench.parse_args(["--write-results"]).out == ROOT / "benchmarks"
    for argv in (["--quick", "--write-results"], ["--write-results", "--out", "x"]):
        with pytest.raises(SystemExit):
            bench.parse_args(argv)
    assert "--write-results" in capsys.readouterr().err
    assert "out/" in (ROOT / ".gitignore").read_text().splitlines()


def test_the_edge_cases_doc_shows_what_the_script_measures(capsys):
    """docs/edge-cases.md pastes the output of scripts/measure_edge_cases.py; it must be the current output."""
    from helpers import require_torch

    require_torch()
    import importlib.util

    spec = importlib.util.spec_from_file_location("measure_edge_cases", ROOT / "scripts" / "measure_edge_cases.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.main([]) == 0
    table = [line for line in capsys.readouterr().out.splitlines() if line.startswith("|")]
    doc = (ROOT / "docs" / "edge-cases.md").read_text().splitlines()
    assert len(table) == len(script.CASES) + 2
    missing = [line for line in table if line not in doc]
    assert not missing, (
        f"docs/edge-cases.md is out of date; re-run the script and paste. First stale row:\n{missing[0]}"
    )
    assert "docs/edge-cases.md" in (ROOT / "README.md").read_text()
