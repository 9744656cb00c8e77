"""What the recurrent layers share (``qwen3_next.GatedDeltaNet``, ``kimi.KimiDeltaAttention``,
``mamba2.Mamba2Mixer``): the decoding state, the parameters' set-up and the checks of a call.

A layer subclasses ``RecurrentLayer`` and declares ``PARAM_NAMES``, ``param_shapes()`` and the sizes the state
needs (``hidden_size``, ``conv_dim``, ``conv_kernel_size``, ``state_heads``, ``head_k_dim``, ``head_v_dim``);
``forward(x, attention_mask=None, state=None) -> ((y, state after the call), cache)`` and
``backward(d_y, cache, d_state=None) -> {"x", every parameter, "state"}`` are its own. ``STATE`` is the class of
its state (``DeltaNetState``, or ``mamba2.Mamba2State``): a state of another kind of layer is refused by name.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._checks import as_array, as_float_array, as_float_dtype, as_generator, as_int
from ..models.layers import checked_params


@dataclass(frozen=True)
class DeltaNetState:
    """A delta-rule layer's decoding state, all it keeps of the tokens before: the conv's last K-1 inputs and the
    delta rule's matrix. Zeros are the start of a sequence; a layer's ``forward`` returns the state after the call,
    which the next call takes (a new object: nothing is updated in place)."""

    conv: np.ndarray  # (B, K-1, C): the last K-1 inputs of the conv ([q | k | v] before it)
    recurrent: np.ndarray  # (B, H, dk, dv): S, the fast-weight memory of each (value) head


def check_layer_options(impl, chunk_size) -> tuple[str, int]:
    """The core's impl and chunk_size, or ValueError naming them."""
    if impl not in ("chunked", "recurrent"):
        raise ValueError(f"impl must be 'chunked' or 'recurrent', got {impl!r}")
    return impl, as_int(chunk_size, "chunk_size", minimum=1)


class RecurrentLayer:
    """The shared part of a delta-rule layer (module docstring)."""

    PARAM_NAMES: tuple[str, ...] = ()
    STATE: type = DeltaNetState  # the class of the layer's state: another kind's state is refused
    hidden_size: int
    conv_kernel_size: int
    head_k_dim: int
    head_v_dim: int
    params: dict[str, np.ndarray]

    @property
    def conv_dim(self) -> int:  # C, the conv's channels
        raise NotImplementedError

    @property
    def state_heads(self) -> int:  # the heads of the recurrent state (the value heads)
        raise NotImplementedError

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        raise NotImplementedError

    def _set_params(self, params, rng, dtype) -> None:
        """``params`` checked against ``param_shapes`` and copied into ``dtype``, or a random start from ``rng``."""
        dtype, shapes = as_float_dtype(dtype), self.param_shapes()
        self.params = checked_params(params, shapes, dtype) if params is not None else self._init(shapes, rng, dtype)

    def _init(self, shapes, rng, dtype) -> dict[str, np.ndarray]:
        """A random start: matrices (the linears, the conv) uniform ±1/√fan_in (nn.Linear's bound), A = exp(A_log)
        uniform in [1, 16], dt_bias and the norm's weight 1. Not a trained model's values."""
        gen = as_generator(rng)
        p = {}
        for name, shape in shapes.items():
            if name == "A_log":
                p[name] = np.log(gen.uniform(1.0, 16.0, shape))
            elif len(shape) == 2 and name != "dt_bias":
                p[name] = gen.uniform(-1.0, 1.0, shape) / np.sqrt(shape[1])
            else:
                p[name] = np.ones(shape)
        return {name: p[name].astype(dtype) for name in self.PARAM_NAMES}

    @property
    def dtype(self) -> np.dtype:
        return self.params[self.PARAM_NAMES[0]].dtype

    def zero_state(self, batch_size: int) -> DeltaNetState:
        """The state at the start of a sequence: zeros, in the parameters' dtype."""
        B = as_int(batch_size, "batch_size", minimum=1)
        conv = np.zeros((B, self.conv_kernel_size - 1, self.conv_dim), self.dtype)
        return self.STATE(conv, np.zeros((B, self.state_heads, self.head_k_dim, self.head_v_dim), self.dtype))

    def _check(self, x, attention_mask, state):
        """x (B, L, E) in the parameters' dtype, attention_mask (B, L) bool or None, state a ``STATE`` of the
        zero state's shapes or None; ValueError naming the argument."""
        x = as_float_array(x, "x", ndim=3)
        if x.shape[-1] != self.hidden_size or x.dtype != self.dtype:
            raise ValueError(
                f"x with shape {x.shape} and dtype {x.dtype} must be (B, L, E = {self.hidden_size}) in "
                f"the parameters' dtype {self.dtype}"
            )
        B, L, _ = x.shape
        if attention_mask is not None:
            attention_mask = as_array(attention_mask, "attention_mask")
            if attention_mask.dtype != np.bool_ or attention_mask.shape != (B, L):
                raise ValueError(
                    f"attention_mask must be a bool (B, L) = {(B, L)} array (True = a token, False = "
                    f"padding), got dtype {attention_mask.dtype} shape {attention_mask.shape}"
                )
        if state is not None:
            if not isinstance(state, self.STATE):
                raise ValueError(f"state must be a {self.STATE.__name__} or None, got {type(state).__name__}")
            zero = self.zero_state(B)
            for name in ("conv", "recurrent"):
                s, z = getattr(state, name), getattr(zero, name)
                if np.shape(s) != z.shape or np.asarray(s).dtype != self.dtype:
                    raise ValueError(
                        f"state.{name} must be {z.shape} in {self.dtype}, got {np.shape(s)} in {np.asarray(s).dtype}"
                    )
        return x, attention_mask

    def _check_d_state(self, d_state) -> None:
        if d_state is not None and not isinstance(d_state, self.STATE):
            raise ValueError(f"d_state must be a {self.STATE.__name__} or None, got {type(d_state).__name__}")
