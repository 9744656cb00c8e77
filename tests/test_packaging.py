"""The package as users get it: one version, the console command, a wheel and an sdist that build cleanly, pass
``twine check``, hold what they must (the explorer's assets, py.typed, the LICENSE) and nothing else (no tests,
no test data), and install into a fresh venv where the tour runs; the core commands need only NumPy."""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import pytest

import mha_numpy

ROOT = Path(__file__).resolve().parents[1]
tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11+ (tomllib)")
# what a build copies from the repository: the sources, never the build's own leftovers or a local site
NOT_COPIED = shutil.ignore_patterns(".git", "site", "build", "dist", "*.egg-info", "__pycache__", ".*cache", "*venv")


def run(cmd, **kw) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, **kw)
    assert done.returncode == 0, f"{cmd} exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def test_one_version_single_sourced():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"] and project["project"]["dynamic"] == ["version"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "mha_numpy.__version__"}
    assert mha_numpy.__version__ == "0.3.0"
    assert f"version: {mha_numpy.__version__}" in (ROOT / "CITATION.cff").read_text()
    assert f"## [Unreleased] - {mha_numpy.__version__}" in (ROOT / "CHANGELOG.md").read_text()
    assert project["project"]["license"] == "MIT"  # an SPDX expression, not the deprecated table
    assert "the mha_numpy contributors" in (ROOT / "LICENSE").read_text()


def test_the_conda_environment_installs_the_runtime_requirements():
    yaml = pytest.importorskip("yaml", reason="pyyaml is not installed: pip install -r requirements-dev.txt")
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    conda = {re.split(r"[<>=]", d)[0] for d in env["dependencies"] if isinstance(d, str)}
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    runtime = [line.split("#")[0].strip() for line in (ROOT / "requirements.txt").read_text().splitlines()]
    for req in filter(None, runtime):
        name = re.split(r"[<>=]", req)[0]
        assert {"matplotlib": "matplotlib-base"}.get(name, name) in conda, req
    assert pip == ["-e ."] and "python" in conda


def test_version_flag_and_console_command(capsys):
    from mha_numpy.__main__ import console, main

    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out == f"mha_numpy {mha_numpy.__version__}\n"
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"mha-numpy": "mha_numpy.__main__:console"} and callable(console)


def test_gradcheck_and_the_exact_gelu_need_only_numpy():
    """Without scipy (blocked in a child process) ``gradcheck`` still passes; GELU's erf is math.erf then."""
    code = (
        "import sys; sys.modules['scipy'] = None; sys.modules['scipy.special'] = None\n"
        "from mha_numpy.__main__ import main; sys.exit(main(['gradcheck']))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "all gradients PASS" in done.stdout, done.stdout[-2000:] + done.stderr[-2000:]

    special = pytest.importorskip("scipy.special", reason="scipy is not installed: pip install -r requirements-dev.txt")
    from mha_numpy.models import layers

    x = np.random.default_rng(0).standard_normal((3, 50)) * 3
    fallback = np.vectorize(math.erf, otypes=[x.dtype])(x)
    assert np.abs(fallback - special.erf(x)).max() <= 4 * np.finfo(x.dtype).eps
    assert layers.erf(x.astype(np.float32)).dtype == np.float32


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    """``python -m build`` (sdist, then the wheel from it) on a copy of the repository, so that it leaves no
    egg-info or build directory in the checkout; built once for this module."""
    pytest.importorskip("build", reason="build is not installed: pip install -r requirements-dev.txt")
    src = tmp_path_factory.mktemp("src") / "mha_numpy"
    shutil.copytree(ROOT, src, ignore=NOT_COPIED)
    out = tmp_path_factory.mktemp("dist")
    done = run([sys.executable, "-m", "build", "--outdir", str(out), str(src)])
    for line in (done.stdout + done.stderr).splitlines():  # setuptools' deprecations, e.g. the license table's
        assert "deprecat" not in line.lower(), line
    return out


@pytest.mark.slow
def test_wheel_and_sdist_build_pass_twine_check_and_hold_what_they_must(dist):
    pytest.importorskip("twine", reason="twine is not installed: pip install -r requirements-dev.txt")
    (wheel,) = dist.glob("*.whl")
    (sdist,) = dist.glob("*.tar.gz")
    assert wheel.name == f"mha_numpy-{mha_numpy.__version__}-py3-none-any.whl"
    run([sys.executable, "-m", "twine", "check", "--strict", str(wheel), str(sdist)])

    names = set(zipfile.ZipFile(wheel).namelist())
    assets = {f"mha_numpy/viz/{p.name}" for p in (ROOT / "mha_numpy" / "viz").iterdir() if p.suffix in (".js", ".css")}
    assert assets and assets <= names, "the explorer's script and style are package data"
    assert "mha_numpy/py.typed" in names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert not [n for n in names if n.split("/")[0] not in ("mha_numpy", wheel.name.split("-py3")[0] + ".dist-info")]
    sources = {p.relative_to(ROOT).as_posix() for p in (ROOT / "mha_numpy").rglob("*.py")}
    assert sources <= names  # every module (a new file is picked up by packages.find, not a list)
    metadata = zipfile.ZipFile(wheel).read(f"{wheel.name.split('-py3')[0]}.dist-info/METADATA").decode()
    assert "License-Expression: MIT" in metadata and "Requires-Dist: numpy" in metadata

    with tarfile.open(sdist) as tar:
        members = [m.split("/", 1)[1] for m in tar.getnames() if "/" in m]
    for required in ("LICENSE", "README.md", "CHANGELOG.md", "CITATION.cff", "pyproject.toml", "mha_numpy/py.typed"):
        assert required in members, required
    assert not [m for m in members if m.startswith("tests/") or m.endswith((".npz", ".ipynb"))]


@pytest.mark.slow
def test_the_wheel_installs_in_a_fresh_venv_and_runs_the_tour(dist, tmp_path):
    """A new user's first minutes: a fresh venv, the wheel (numpy comes from pip's cache), the console command."""
    (wheel,) = dist.glob("*.whl")
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", str(venv)])
    bin_ = venv / ("Scripts" if os.name == "nt" else "bin")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}  # not this checkout
    run([str(bin_ / "python"), "-m", "pip", "install", "--quiet", str(wheel)], env=env, cwd=tmp_path)
    where = run([str(bin_ / "python"), "-c", "import mha_numpy; print(mha_numpy.__file__)"], env=env, cwd=tmp_path)
    assert Path(where.stdout.strip()).is_relative_to(venv)
    version = run([str(bin_ / "mha-numpy"), "--version"], env=env, cwd=tmp_path)
    assert version.stdout.strip() == f"mha_numpy {mha_numpy.__version__}"
    tour = run([str(bin_ / "mha-numpy"), "tour"], env=env, cwd=tmp_path)
    assert "PASS" in tour.stdout and "FAIL" not in tour.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["venv"]  # the tour writes nothing without --out
