"""transformers' RoPE for the importers and the cross-checks: a config's ``rope_parameters`` as our ``rope_scaling``
(``hf_rope_scaling``), and its rotary modules run in float64 (``float64_rope``), whose (cos, sin) the checks feed
the attention modules. torch is passed in (imported lazily by the callers)."""

from __future__ import annotations

from contextlib import contextmanager


def hf_rope_scaling(config) -> dict | None:
    """A config's ``rope_parameters`` as our ``rope_scaling`` (None for "default"): the dict without rope_theta
    (our ``rope_theta``), with the config's ``max_position_embeddings`` where the rope_type reads it."""
    params = dict(getattr(config, "rope_parameters", None) or {})
    if params.get("rope_type", "default") == "default":
        return None
    params.pop("rope_theta", None)
    if params["rope_type"] in ("dynamic", "yarn", "longrope"):
        params["max_position_embeddings"] = int(config.max_position_embeddings)
    return params


@contextmanager
def float64_rope(torch):
    """transformers' rotary modules computed in float64 for the cross-checks: they build their tables and angles
    with dtype=torch.float, torch.float32, .float() and the default dtype, which this lifts for the block (not
    thread-safe: torch's module attributes are patched while it runs)."""
    saved, default = (torch.float, torch.float32, torch.Tensor.float), torch.get_default_dtype()
    torch.float, torch.float32, torch.Tensor.float = torch.float64, torch.float64, torch.Tensor.double
    try:
        torch.set_default_dtype(torch.float64)
        yield
    finally:
        torch.float, torch.float32, torch.Tensor.float = saved
        torch.set_default_dtype(default)
