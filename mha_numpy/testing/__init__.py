"""Ground truth for your attention kernel: run it over a case matrix against mha_numpy's float64 reference.

    from mha_numpy.testing import verify_attention, from_torch
    print(verify_attention(my_numpy_attention, my_numpy_attention_vjp))   # NumPy: the calling convention below
    print(verify_attention(from_torch(my_torch_attention)))               # torch: autograd for the backward

or ``python -m mha_numpy verify MODULE:FUNCTION [--torch | --jax]``. The calling convention, the case matrix, the
tolerance rule (derived: k = 2 times our plain path's error in the same dtype, plus a floor) and the detection
of conventions are in docs/verify.md. One job a file:

    cases        the matrix (``matrix("quick" | "full")``, ``shrink`` for a fast CI) and each case's inputs
    extra_masks  the two masks the matrix needs that mha_numpy.masks lacks (packed documents, blocked rows)
    dtypes       float64, float32, float16, bfloat16 by name; rounding to them in NumPy
    conventions  the float64 reference, and the reference under each alternative convention
    tolerance    the budget of each tensor, and our plain path in the case's dtype
    adapters     the calling convention, NumPy functions, mha_numpy's kernels, masks and layouts at the edge
    torch_adapters  torch functions (autograd), torch.nn.MultiheadAttention, Hugging Face attention functions
    jax_adapter  JAX functions (jax.vjp)
    verify       the run and the detection;  report  the table, JSON, HTML;  ci  pytest helpers
    flex_verify  a torch FlexAttention call and your backward against mha_numpy.flex (``verify_flex``), with
                 flex_cases (its cases), flex_twins (the mods' NumPy twins), flex_report (its report)

torch and JAX are imported only inside the adapters' functions: ``import mha_numpy.testing`` needs NumPy alone.
"""

from __future__ import annotations

from .adapters import MASK_CONVENTIONS, Call, Implementation, NotSupported, Outcome, from_numpy, kernel
from .cases import FEATURES, MASK_KINDS, Case, CaseInputs, matrix, shrink
from .ci import assert_attention_close, attention_cases
from .conventions import ALTERNATIVES, Convention, reference
from .flex_cases import FlexCase, flex_cases
from .flex_report import FlexReport
from .flex_verify import verify_flex
from .jax_adapter import from_jax
from .report import CaseResult, VerifyReport
from .tolerance import Check, K
from .torch_adapters import from_torch, hf_attention, torch_function, torch_mha
from .verify import run_case, verify_attention

__all__ = ["verify_attention", "run_case", "attention_cases", "assert_attention_close", "from_numpy", "from_torch",
           "torch_function", "torch_mha", "hf_attention", "from_jax", "kernel", "Implementation", "Call", "Outcome",
           "NotSupported", "Case", "CaseInputs", "matrix", "shrink", "MASK_KINDS", "FEATURES", "MASK_CONVENTIONS",
           "ALTERNATIVES", "Convention", "reference", "K", "Check", "CaseResult", "VerifyReport", "verify_flex",
           "FlexCase", "flex_cases", "FlexReport"]  # fmt: skip
