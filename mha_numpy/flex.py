"""FlexAttention on the CPU, with its backward: torch 2.13's ``flex_attention`` on NumPy arrays.

    out = softmax(score_mod(query keyᵀ · scale; b, h, q_idx, kv_idx) masked by mask_mod) value

    out, cache = flex_attention_forward(query, key, value, score_mod, block_mask, scale, enable_gqa, params)
    dq, dk, dv, d_params = flex_attention_backward(d_out, cache, d_lse=None)
    out = flex_attention(query, key, value, score_mod, ...)  # torch's call: out, (out, lse) or (out, AuxOutput)

query (B, Hq, Lq, d), key (B or 1, Hkv, Lk, d), value (B or 1, Hkv, Lk, dv), torch's layout. With ``enable_gqa``
Hq is a multiple of Hkv: query head h reads key head h // (Hq / Hkv) (the keys repeated over their group, their
gradients summed back over it); a key of batch 1 serves every batch item (its gradient summed over them).

The mods are called vectorised, never per element, on whatever block of scores a kernel holds:

    score_mod(score, b, h, q_idx, kv_idx, **params) -> score'   score: the block (B, H, Lq, Lk), one tile, or a
        flat (n,) run of entries; b, h, q_idx, kv_idx: integer arrays broadcastable to it (h: the query's head)
    mask_mod(b, h, q_idx, kv_idx) -> bool array broadcastable to (B, H, Lq, Lk), True = may attend

``params`` {name: float array} are the arrays the mod learns, passed to it by keyword; the backward returns each
one's gradient. The mod runs on the kernels' one score hook (``kernels.ScoreMod``), so every kernel takes it.

The derivative of the mod is the user's ``score_mod_vjp(score, b, h, q_idx, kv_idx, d_out, **params) ->
(d_score, {name: d_param})``, or derived here by the complex step: for an analytic f, f(s + iε) = f(s) + iε f'(s)
+ O(ε²) with no subtraction, so f'(s) = Im f(s + iε) / ε exact to rounding at ε = 1e-20 (a parameter: one complex
step per element, up to ``MAX_DERIVED_PARAM`` elements). A derived derivative is trusted only after a probe: at a
few random entries of this call's scores it must agree with central differences, or the call is refused (np.abs,
``.real``, a rounding: parts the complex step cannot see through); both in ``flex_derive``. docs/flex.md has the
mods torch and NumPy share.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from . import kernels
from ._checks import default_scale
from .block_mask import BlockMask
from .flex_derive import complex_step_vjp, probe

MAX_DERIVED_PARAM = 4096  # a parameter with more elements needs score_mod_vjp
_NAME = "score_mod"  # the ScoreMod's name: the kernels' backward returns its parameters' gradients under it


class AuxRequest(NamedTuple):
    """torch's ``AuxRequest``: which auxiliary outputs ``flex_attention`` returns (``lse``: each row's log-sum-exp)."""

    lse: bool = False
    max_scores: bool = False


class AuxOutput(NamedTuple):
    """torch's ``AuxOutput``: the requested auxiliary outputs, None where not requested."""

    lse: np.ndarray | None = None
    max_scores: np.ndarray | None = None


@dataclass
class FlexCache:
    """What ``flex_attention_backward`` needs: the kernel's cache and how the keys were widened (GQA, batch 1)."""

    kernel: Any
    inner: Any  # the kernel's own cache
    group: int  # query heads per key head
    kv_batch: int  # key/value batch (1 or B)
    params: dict  # the learned arrays, by name

    @property
    def lse(self) -> np.ndarray:
        """(B, Hq, Lq) float64, each row's log-sum-exp (-inf for a row that may attend to no key)."""
        return self.inner.lse


def _broadcasts(shape, to) -> bool:
    """Whether an array of ``shape`` broadcasts to ``to`` exactly."""
    try:
        return np.broadcast_shapes(shape, to) == tuple(to)
    except ValueError:
        return False


def _read_only(a):
    view = a.view()  # the mods get views they cannot write through: an input is never changed
    view.flags.writeable = False
    return view


def _array(x, name: str, ndim: int | None = None) -> np.ndarray:
    if not isinstance(x, np.ndarray) or x.dtype.kind != "f":
        kind = type(x).__name__ if not isinstance(x, np.ndarray) else f"array of {x.dtype}"
        raise ValueError(f"{name} must be a float NumPy array, got {kind}")
    if ndim is not None and x.ndim != ndim:
        raise ValueError(f"{name} must be (B, H, L, d), got shape {x.shape}")
    return x


def _check_inputs(query, key, value, enable_gqa):
    query, key, value = (_array(x, n, 4) for x, n in ((query, "query"), (key, "key"), (value, "value")))
    if not query.dtype == key.dtype == value.dtype:
        raise ValueError(f"query, key, value must share one dtype: got {query.dtype}, {key.dtype}, {value.dtype}")
    if key.shape[:3] != value.shape[:3] or query.shape[-1] != key.shape[-1]:
        raise ValueError(f"key {key.shape} and value {value.shape} must share (B, H, Lk), key and query "
                         f"{query.shape} the head dim d")  # fmt: skip
    if key.shape[0] not in (1, query.shape[0]):
        raise ValueError(f"key's batch {key.shape[0]} must be 1 or query's {query.shape[0]}")
    hq, hkv = query.shape[1], key.shape[1]
    if hq != hkv and not (enable_gqa and hkv > 0 and hq % hkv == 0):
        raise ValueError(f"query has {hq} heads and key {hkv}: give enable_gqa=True with Hq a multiple of Hkv"
                         if not enable_gqa else f"enable_gqa needs Hq = {hq} a multiple of Hkv = {hkv}")  # fmt: skip
    return query, key, value


def _check_params(params, score_mod):
    if params is None:
        return {}
    if not isinstance(params, dict):
        raise ValueError(f"params must be a dict {{name: float array}}, got {type(params).__name__}")
    if params and score_mod is None:
        raise ValueError("params are given but no score_mod reads them")
    for name, p in params.items():
        if not isinstance(name, str) or name in ("score", "b", "h", "q_idx", "kv_idx", "d_out"):
            raise ValueError(f"params: {name!r} is not a usable keyword name for score_mod")
        _array(p, f"params[{name!r}]")
    return {name: _read_only(p) for name, p in params.items()}


def _checked_mod(score_mod):
    """score_mod with its result checked: a float array of the block's shape (broadcast) in the block's dtype."""

    def mod(score, b, h, q_idx, kv_idx, **params):
        try:
            out = score_mod(_read_only(np.asarray(score)), b, h, q_idx, kv_idx, **params)
        except Exception as e:
            raise ValueError(f"score_mod raised {type(e).__name__}: {e}") from e
        out = np.asarray(out)
        want = "c" if np.iscomplexobj(score) or any(np.iscomplexobj(p) for p in params.values()) else "f"
        if out.dtype.kind not in (want, "f"):
            raise ValueError(f"score_mod must return float scores, got {out.dtype} for {score.dtype} scores")
        if not _broadcasts(out.shape, score.shape):
            raise ValueError(f"score_mod returned shape {out.shape} for a block of scores of shape {score.shape}")
        dtype = score.dtype if out.dtype.kind == "f" or np.iscomplexobj(score) else np.complex128
        return np.broadcast_to(out.astype(dtype, copy=False), score.shape)  # a read-only view: no copy, and a
        # kernel that wrote into it would raise instead of changing an array the mod returned and may still hold

    return mod


def _checked_vjp(score_mod_vjp, params):
    def vjp(score, b, h, q_idx, kv_idx, d_out, **kw):
        try:
            d_score, grads = score_mod_vjp(_read_only(score), b, h, q_idx, kv_idx, _read_only(d_out), **kw)
        except Exception as e:
            raise ValueError(f"score_mod_vjp raised {type(e).__name__}: {e}") from e
        d_score = np.asarray(d_score)
        if d_score.shape != score.shape:
            raise ValueError(f"score_mod_vjp returned d_score of shape {d_score.shape} for scores {score.shape}")
        grads = dict(grads or {})
        for name, g in grads.items():
            if name not in params or np.shape(g) != params[name].shape:
                raise ValueError(f"score_mod_vjp returned a gradient {name!r} of shape {np.shape(g)}; params: "
                                 f"{ {n: p.shape for n, p in params.items()} }")  # fmt: skip
        grads = {n: np.asarray(g, dtype=params[n].dtype) for n, g in grads.items()}
        return d_score.astype(score.dtype, copy=False), grads

    return vjp


def _mask(mask_mod, block_mask, shape):
    """The mask of the call: our ``BlockMask`` itself, else the bool mask (broadcastable to (B, H, Lq, Lk)) that
    mask_mod (or another block mask's) gives, or None."""
    if block_mask is not None:
        given = getattr(block_mask, "mask_mod", None)
        if not callable(given):
            raise ValueError(f"block_mask must carry its mask_mod (a BlockMask), got {type(block_mask).__name__}")
        lengths = getattr(block_mask, "seq_lengths", None)
        if lengths is not None and tuple(int(n) for n in lengths) != tuple(shape[2:]):
            raise ValueError(f"block_mask is for (Q_LEN, KV_LEN) = {tuple(lengths)}, the call's is {shape[2:]}")
        if mask_mod is not None and mask_mod is not given:
            raise ValueError("give mask_mod or block_mask, not both")
        if isinstance(block_mask, BlockMask):  # ours: the kernels take it as it is (the chunked one visits only
            return block_mask  # its listed blocks and evaluates the mask_mod on the partial ones: no (L, L) array)
        mask_mod = given  # another's (torch's own BlockMask): its mask_mod, evaluated here
    if mask_mod is None:
        return None
    index = np.ix_(*(np.arange(n) for n in shape))  # (B,1,1,1), (1,H,1,1), (1,1,Lq,1), (1,1,1,Lk)
    try:
        mask = np.asarray(mask_mod(*index))
    except Exception as e:
        raise ValueError(f"mask_mod raised {type(e).__name__}: {e}") from e
    if mask.dtype != np.bool_:
        raise ValueError(f"mask_mod must return a bool array (True = may attend), got {mask.dtype}")
    if not _broadcasts(mask.shape, shape):
        raise ValueError(f"mask_mod returned shape {mask.shape}, not broadcastable to (B, H, Lq, Lk) {shape}")
    return mask.reshape((1,) * (4 - mask.ndim) + mask.shape)  # (b, h, Lq, Lk), b and h 1 or full


def _kernel(kernel):
    if isinstance(kernel, kernels.Kernel):
        return kernel
    try:
        return kernels.get_kernel(kernel)
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"kernel must be a registered name {sorted(kernels.KERNELS)} or a Kernel: {e}") from None


def flex_attention_forward(
    query, key, value, score_mod=None, block_mask=None, scale=None, enable_gqa=False, params=None,
    score_mod_vjp=None, mask_mod=None, kernel="vectorized", *, _derive=True,
):  # fmt: skip
    """query (B, Hq, Lq, d), key (B or 1, Hkv, Lk, d), value (B or 1, Hkv, Lk, dv) -> out (B, Hq, Lq, dv), cache.

    score_mod: None or ``score_mod(score, b, h, q_idx, kv_idx, **params)``, vectorised (module docstring).
    block_mask: None or a BlockMask: ours (``block_mask.create_block_mask``) goes to the kernel as it is (the
    chunked kernel visits its listed blocks); another's (torch's own) by its ``mask_mod``, evaluated densely.
    mask_mod: None or ``mask_mod(b, h, q_idx, kv_idx) -> bool`` (instead of block_mask).
    scale: the scores' factor, default 1/√d.   enable_gqa: Hq a multiple of Hkv.
    params: {name: float array} the score_mod's learned arrays, by keyword.   score_mod_vjp: its VJP, or None
    (then derived by complex steps and probed).   kernel: a registered name or a ``kernels.Kernel``.
    A row that may attend to no key gives 0 (torch: 0 too), never NaN.
    """
    query, key, value = _check_inputs(query, key, value, enable_gqa)
    params = _check_params(params, score_mod)
    scale = default_scale(query.shape[-1], scale)
    kern = _kernel(kernel)
    B, Hq, Lq, _ = query.shape
    group = Hq // key.shape[1] if key.shape[1] else 1
    mask = _mask(mask_mod, block_mask, (B, Hq, Lq, key.shape[2]))
    mods = ()
    if score_mod is not None:
        if not callable(score_mod) or (score_mod_vjp is not None and not callable(score_mod_vjp)):
            raise ValueError("score_mod and score_mod_vjp must be callables")
        mod = _checked_mod(score_mod)
        if score_mod_vjp is None and _derive:
            for name, p in params.items():
                if p.size > MAX_DERIVED_PARAM:
                    raise ValueError(f"params[{name!r}] has {p.size} > {MAX_DERIVED_PARAM} elements: give "
                                     "score_mod_vjp")  # fmt: skip
        probe(mod, query, key, scale, group, params, derive=score_mod_vjp is None and _derive)
        vjp = complex_step_vjp(mod) if score_mod_vjp is None else _checked_vjp(score_mod_vjp, params)
        mods = (kernels.ScoreMod(_NAME, mod, vjp, params),)
    k = np.broadcast_to(key, (B, *key.shape[1:]))  # F0: (B, Hkv, Lk, d), a key of batch 1 serves every batch item
    v = np.broadcast_to(value, (B, *value.shape[1:]))  # F0: (B, Hkv, Lk, dv)
    k = np.repeat(k, group, axis=1) if group > 1 else k  # F1: (B, Hq, Lk, d), query head h reads key head h // group
    v = np.repeat(v, group, axis=1) if group > 1 else v  # F1: (B, Hq, Lk, dv)
    out, inner = kern.forward(query, k, v, mask=mask, scale=scale, score_mods=mods)  # F2: (B, Hq, Lq, dv)
    return out, FlexCache(kern, inner, group, key.shape[0], params)


def flex_attention_backward(d_out, cache: FlexCache, d_lse=None):
    """d_out (B, Hq, Lq, dv), d_lse None or (B, Hq, Lq) the gradient of ``cache.lse`` -> dq (B, Hq, Lq, d),
    dk (Bkv, Hkv, Lk, d), dv (Bkv, Hkv, Lk, dv), d_params {name: gradient, the shape of params[name]}."""
    grads = cache.kernel.backward(d_out, cache.inner, d_lse=d_lse)
    dq, dk, dv = grads[:3]  # ← F2: dk, dv (B, Hq, Lk, ·)
    if cache.group > 1:  # ← F1, the repeat: each key head's gradient summed over the query heads of its group
        dk = dk.reshape(dk.shape[0], -1, cache.group, *dk.shape[2:]).sum(axis=2)  # (B, Hkv, Lk, d)
        dv = dv.reshape(dv.shape[0], -1, cache.group, *dv.shape[2:]).sum(axis=2)  # (B, Hkv, Lk, dv)
    if cache.kv_batch == 1 and dk.shape[0] > 1:  # ← F0, the broadcast over the batch
        dk, dv = dk.sum(axis=0, keepdims=True), dv.sum(axis=0, keepdims=True)  # (1, Hkv, Lk, ·)
    got = grads.score_params.get(_NAME, {})
    d_params = {n: np.asarray(got.get(n, np.zeros_like(p)), dtype=p.dtype) for n, p in cache.params.items()}
    return dq, dk, dv, d_params


def flex_attention(
    query, key, value, score_mod=None, block_mask=None, scale=None, enable_gqa=False, return_lse=False,
    kernel_options=None, *, return_aux=None, params=None, mask_mod=None, kernel="vectorized",
):  # fmt: skip
    """torch's ``flex_attention`` on NumPy arrays, forward only: -> out (B, Hq, Lq, dv); with
    ``return_aux=AuxRequest(lse=True)`` -> (out, AuxOutput(lse=...)); with ``return_lse=True`` -> (out, lse).
    lse (B, Hq, Lq) in the query's dtype, natural log, -inf for a row with no key. ``kernel_options`` is torch's
    (accepted, ignored). The score_mod is not differentiated here (no probe): ``flex_attention_forward`` is."""
    if return_lse and return_aux is not None:
        raise ValueError("give return_lse or return_aux, not both (torch refuses both too)")
    if return_aux is not None and getattr(return_aux, "max_scores", False):
        raise ValueError("return_aux: max_scores is not computed here yet; ask for lse only")
    out, cache = flex_attention_forward(query, key, value, score_mod, block_mask, scale, enable_gqa, params,
                                        None, mask_mod, kernel, _derive=False)  # fmt: skip
    lse = cache.lse.astype(out.dtype) if return_lse or getattr(return_aux, "lse", False) else None
    if return_lse:
        return out, lse
    if return_aux is not None:
        return out, AuxOutput(lse=lse)
    return out
