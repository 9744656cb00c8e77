"""transformers' RoPE for the importers and the cross-checks: a config's ``rope_parameters`` as our ``rope_scaling``
(``hf_rope_scaling``), and its rotary modules run in float64 (``float64_rope``), whose (cos, sin) the checks feed
the attention modules. torch is passed in (imported lazily by the callers)."""

from __future__ import annotations

from .lift import float32_is_float64


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


float64_rope = float32_is_float64
"""transformers' rotary modules computed in float64 for the cross-checks (they build their tables and angles with
dtype=torch.float, torch.float32, .float() and the default dtype): ``lift.float32_is_float64``, this file's name for
it."""
