"""transformers' own code run in float64 where it says float32, for the float64 cross-checks: ``float32_is_float64``.

Several transformers modules and functions compute in float32 whatever their inputs' dtype: they cast with
``.to(torch.float32)``, ``.float()``, ``dtype=torch.float`` or the default dtype (the rotary modules' angles,
Qwen3-Next's and Kimi Linear's gates, delta-rule cores and gated RMSNorms, their caches' recurrent state). Within
the block those four names mean float64, so the float64 check runs transformers' code itself, unedited, instead of
a hand-made copy without the casts; ``call_in_float64`` calls one function so and checks its result is float64.
torch is passed in (imported lazily by the callers).
"""

from __future__ import annotations

from contextlib import contextmanager


@contextmanager
def float32_is_float64(torch):
    """Within the block ``torch.float``, ``torch.float32``, ``torch.Tensor.float`` and the default dtype are float64;
    restored afterwards. Process-wide while it lasts (torch's module attributes are patched: not for threads
    computing in float32 meanwhile). Not lifted: a dtype read before the block (a default argument
    ``dtype=torch.float32`` is evaluated when its function is defined), ``torch.half`` and friends: a check asserts
    its outputs' dtype."""
    saved, default = (torch.float, torch.float32, torch.Tensor.float), torch.get_default_dtype()
    torch.float, torch.float32, torch.Tensor.float = torch.float64, torch.float64, torch.Tensor.double
    try:
        torch.set_default_dtype(torch.float64)
        yield
    finally:
        torch.float, torch.float32, torch.Tensor.float = saved
        torch.set_default_dtype(default)


def call_in_float64(torch, function, *args, **kwargs):
    """``function(*args, **kwargs)`` (transformers' own, unedited) within ``float32_is_float64`` -> its result, every
    tensor of it float64 (TypeError otherwise: a cast the lift did not reach). Tensor arguments: float64 (ValueError
    naming the first that is not: the lift would compute a float32 input in float64)."""
    name = getattr(function, "__name__", repr(function))
    for at, t in {**dict(enumerate(args)), **kwargs}.items():
        if isinstance(t, torch.Tensor) and t.dtype != torch.float64:
            raise ValueError(f"{name} in float64 takes float64 tensors, got {t.dtype} for argument {at!r}")
    with float32_is_float64(torch):
        result = function(*args, **kwargs)
    returned = result if isinstance(result, tuple) else (result,)
    wrong = [t.dtype for t in returned if t is not None and t.dtype != torch.float64]
    if wrong:
        raise TypeError(f"{name} returned {wrong} with its float32 casts lifted: a cast the lift does not reach")
    return result
