"""Public names are a promise (issue 34): a name that moves keeps a deprecated alias for one minor version.

0.3 removed ``mha_numpy.chunked`` and ``mha_numpy.naive`` silently; they are back as aliases that warn and give
0.2's public names, each the same object as at its new place. The lists below are 0.2's names, written from that
release (``git show 1246a08:mha_numpy/kernels/chunked.py``, which ``mha_numpy.chunked`` was), not read from the
aliases, so an alias that loses a name fails here.
"""

from __future__ import annotations

import re
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import mha_numpy
from mha_numpy import kernels, threads
from mha_numpy.kernels import base

ROOT = Path(__file__).resolve().parents[1]

# alias -> (the module it points to, {0.2's public name: its home now})
ALIASES = {
    "mha_numpy.chunked": (
        "mha_numpy.kernels.chunked",
        {
            "ChunkedKernel": kernels.chunked, "ChunkedCache": kernels.chunked, "DEFAULT_BLOCK_SIZE": kernels.chunked,
            "DEFAULT_NUM_THREADS": kernels.chunked, "MIN_PART": kernels.chunked, "AttentionArgs": base,
            "Kernel": base, "AVAILABLE_CORES": threads, "pooled_matmul": threads, "run_items": threads,
            "check_d_context": kernels.chunked, "positive_int_or_none": kernels.chunked,
        },
    ),
    "mha_numpy.naive": (
        "mha_numpy.kernels.naive",
        {
            "NaiveKernel": kernels.naive, "NaiveCache": kernels.naive, "AttentionArgs": base, "Kernel": base,
            "check_d_context": kernels.naive,
        },
    ),
}  # fmt: skip


def fresh_import(name: str):
    """Import ``name`` as a first import would (the module dropped from sys.modules and from its parent)."""
    sys.modules.pop(name, None)
    parent, _, leaf = name.rpartition(".")
    if hasattr(sys.modules[parent], leaf):
        delattr(sys.modules[parent], leaf)
    __import__(name)  # a builtin: the frame that imports is the caller's, as for an import statement
    return sys.modules[name]


@pytest.mark.parametrize("alias", sorted(ALIASES))
def test_importing_an_alias_warns_naming_the_new_place_at_the_callers_line(alias):
    new_place, _ = ALIASES[alias]
    with pytest.warns(DeprecationWarning, match=re.escape(new_place)) as record:
        fresh_import(alias)
    (warning,) = [w for w in record if issubclass(w.category, DeprecationWarning)]
    assert f"{alias} is deprecated since 0.3" in str(warning.message)
    assert "0.4" in str(warning.message)  # when it goes
    assert warning.filename == __file__, warning.filename  # the line that imports, not the alias's own


@pytest.mark.parametrize("alias", sorted(ALIASES))
def test_an_alias_gives_every_old_public_name_as_the_same_object_as_its_new_home(alias):
    _, names = ALIASES[alias]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        module = fresh_import(alias)
    for name, home in names.items():
        assert getattr(module, name) is getattr(home, name), f"{alias}.{name}"
    assert sorted(module.__all__) == sorted(names)
    from_import = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        exec(f"from {alias} import *", from_import)
    assert set(from_import) - {"__builtins__"} == set(names)


@pytest.mark.parametrize("alias", sorted(ALIASES))
def test_an_aliased_kernel_returns_what_0_3_returns_five_gradients(alias):
    """The CHANGELOG's promise: return shapes are 0.3's (backward: dq, dk, dv, d_bias, d_sinks), not 0.2's four."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        module = fresh_import(alias)
    kernel = module.ChunkedKernel(block_size=2, num_threads=1) if alias.endswith("chunked") else module.NaiveKernel()
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 2, 3, 4)) for _ in range(3))  # (B, H, L, d)
    context, cache = kernel.forward(q, k, v)
    grads = kernel.backward(np.ones_like(context), cache)
    assert len(grads) == 5 and grads[3] is None and grads[4] is None  # no bias, no sinks
    assert [g.shape for g in grads[:3]] == [q.shape, k.shape, v.shape]
    assert cache.lse.shape == (1, 2, 3)


def test_no_module_of_the_package_imports_a_deprecated_alias():
    """The library itself never warns: a user sees the warning only for their own import."""
    from test_project import import_graph

    users = {name: deps & set(ALIASES) for name, deps in import_graph().items() if deps & set(ALIASES)}
    assert not users, users


def test_aliases_go_at_the_minor_version_after_the_move():
    """One minor version: moved in 0.3, gone in 0.4. This test fails on the release that forgets to remove them."""
    major, minor = (int(x) for x in mha_numpy.__version__.split(".")[:2])
    present = [alias for alias in ALIASES if (ROOT / (alias.replace(".", "/") + ".py")).exists()]
    if (major, minor) >= (0, 4):
        assert not present, f"remove the aliases deprecated in 0.3 ({present}) and this test's entries"
    else:
        assert present == list(ALIASES)


def test_the_changelog_states_the_policy_and_lists_0_3s_breaking_changes():
    text = (ROOT / "CHANGELOG.md").read_text()
    section = text.split("## [Unreleased] - 0.3.0", 1)[1].split("\n## [", 1)[0]
    assert "### Changed (breaking)" in section
    breaking = section.split("### Changed (breaking)", 1)[1].split("\n### ", 1)[0]
    for name in ("scaled_dot_product_attention_backward", "return_hidden_grads", *ALIASES):
        assert name in breaking, name
    assert "DeprecationWarning" in text and "one minor version" in text
