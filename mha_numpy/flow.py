"""Walking the steps of ``mha_numpy.steps``: forwards, backwards, and one head group at a time (``recompute=True``).

``Flow`` names every tensor of one call, with its shape, as llm.c's ``ActivationTensors`` declares its activations:
a step reads some fields and writes others. The backward uses a second ``Flow`` whose fields hold the gradients of
the tensors of the same names, so a backward line reads like its forward line reversed:

    forward:   f.Q, s["q_rope"] = F.rope_forward(f.Q, f.pos_q, theta)
    backward:  g.Q = F.rope_backward(g.Q, s["q_rope"])

Head groups. Heads are independent until the output projection, and that projection is a sum over heads:

    output = Σ_groups merged_g W_o[:, cols_g]ᵀ + b_o        cols_g = the g·d features of group g's heads

so ``recompute=True`` runs the same steps on one group of heads at a time (one key/value head and the H / Hkv query
heads that read it): the flow of a group sees its heads' slices of every parameter (``GroupParams``, each sliced
along the head axis its ``steps.Param`` declares), of the mask and of a given dropout mask; the outputs of the groups
are summed. The cache keeps only the inputs and the call's arguments (``RecomputeCache``); the backward recomputes
each group's forward, then walks that group's steps backwards, writing the group's slices of the parameters'
gradients (``GroupGrads``) and adding its share to the inputs' gradients. Sampled dropout draws each group's
keep-mask from a generator seeded by (one seed per call, the group's first head), so the backward replays the
forward's exactly. The memory it saves is measured in docs/performance.md, "Memory".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace

import numpy as np

from .kernels import AttentionArgs


@dataclass(eq=False)
class Flow:
    """Every tensor of one call of the data path, by name, and the facts of the call the steps read.

    In a backward flow the tensor fields hold the gradients of the tensors of those names, ``bias`` the gradient
    of ``args.bias``, and ``P`` receives the parameters' gradients.
    """

    # the tensors, in the order of the data path (Lk: the keys the kernel sees, cached and appended ones included)
    query: np.ndarray = None  # (B, Lq, E)
    key: np.ndarray = None  # (B, Lk_in, kdim)
    value: np.ndarray = None  # (B, Lk_in, vdim)
    q: np.ndarray = None  # (B, Lq, E)
    k: np.ndarray = None  # (B, Lk_in, Ekv)
    v: np.ndarray = None  # (B, Lk_in, Ekv)
    latent: np.ndarray = None  # (B, Lk, r): MLA's compressed keys and values, c_kv (mha_numpy/latent_steps.py)
    k_rope: np.ndarray = None  # (B, 1, Lk, dr): MLA's rope key, one head that every head reads
    Q: np.ndarray = None  # (B, H, Lq, d)
    K: np.ndarray = None  # (B, Hkv, Lk, d)
    V: np.ndarray = None  # (B, Hkv, Lk, d)
    K_heads: np.ndarray = None  # (B, H, Lk, d): the keys each query head reads
    V_heads: np.ndarray = None  # (B, H, Lk, d)
    args: AttentionArgs = None  # the kernel call's mask, score terms (bias, score mods), dropout, scale
    bias: np.ndarray = None  # backward only: the gradient of args.bias
    sinks: np.ndarray = None  # backward only: the gradient of args.sinks
    score_params: dict = None  # backward only: the score mods' parameter gradients, {mod: {param: gradient}}
    shared_kv: tuple = None  # backward only: the gradients of K, V from the layers that read them (ShareKV)
    context: np.ndarray = None  # (B, H, Lq, d)
    merged: np.ndarray = None  # (B, Lq, E)
    output: np.ndarray = None  # (B, Lq, E)
    attention: object = None  # the kernel's cache
    # the facts of the call
    P: Mapping = None  # the parameters (forward) or where their gradients go (backward)
    H: int = 0  # query heads in this flow (a group's, under recompute)
    Hkv: int = 0  # key/value heads in this flow
    heads: slice = None  # which of the module's query heads this flow holds
    B: int = 0
    Lq: int = 0
    Lk: int = 0  # keys given to the call (key.shape[1])
    cached: int = 0  # positions in the KV cache before the call
    positions: object = None  # as given to forward (None: 0, 1, ... after the cached ones)
    pos_q: np.ndarray = None  # the queries' RoPE positions
    pos_k: np.ndarray = None  # the keys' RoPE positions
    kv_cache: object = None
    self_attention: bool = False  # query is key is value (one fused projection)
    kernel: object = None  # the kernel of this call, chosen once
    matmul: object = None  # the kernel's product, for the projections
    owner: object = None  # the module


def forward(steps, f: Flow) -> dict:
    """Walk the steps forwards on ``f``; -> each step's caches by name."""
    s: dict = {}
    for step in steps:
        step.forward(f, s)
    return s


def backward(steps, g: Flow, s: dict) -> None:
    """Walk the steps backwards: ``g`` starts with the gradient of the output and ends with those of the inputs."""
    for step in reversed(steps):
        step.backward(g, s)


# --------------------------------------------------------------------------- head groups


def head_groups(num_heads: int, num_kv_heads: int) -> list[slice]:
    """The groups of ``recompute=True``: one key/value head and its H / Hkv query heads each."""
    g = num_heads // num_kv_heads
    return [slice(h, h + g) for h in range(0, num_heads, g)]


def _index(spec, shape, hs: slice, num_heads: int, num_kv_heads: int):
    """The index of the group ``hs``'s slice of a parameter of ``shape`` laid out as ``spec`` declares."""
    if spec.heads == "q":
        per = shape[spec.axis] // num_heads
        cut = slice(hs.start * per, hs.stop * per)
    else:  # "kv": the group's one key/value head
        per, kv = shape[spec.axis] // num_kv_heads, hs.start // (num_heads // num_kv_heads)
        cut = slice(kv * per, (kv + 1) * per)
    return (slice(None),) * spec.axis + (cut,)


class GroupParams(Mapping):
    """The parameters as one head group sees them: views of its heads' slices ("first": only the first group's)."""

    def __init__(self, params: dict, specs: dict, hs: slice, num_heads: int, num_kv_heads: int) -> None:
        self.params, self.specs, self.hs, self.n = params, specs, hs, (num_heads, num_kv_heads)

    def __getitem__(self, name):
        p, spec = self.params[name], self.specs[name]
        if spec.heads is None:
            return p
        if spec.heads == "first":
            return p if self.hs.start == 0 else None
        return p[_index(spec, p.shape, self.hs, *self.n)]

    def __iter__(self):
        return iter(self.params)

    def __len__(self):
        return len(self.params)


class GroupGrads:
    """Where a group's parameter gradients go: its slices of the whole gradients (shared ones are summed)."""

    def __init__(self, grads: dict, specs: dict, hs: slice, num_heads: int, num_kv_heads: int) -> None:
        self.grads, self.specs, self.hs, self.n = grads, specs, hs, (num_heads, num_kv_heads)

    def __setitem__(self, name, value):
        if value is None:  # e.g. no bias gradient, or not the first group's output bias
            return
        spec, whole = self.specs[name], self.grads[name]
        if spec.heads == "first":
            whole[...] = value
        elif spec.heads is None:
            whole += value
        else:
            whole[_index(spec, whole.shape, self.hs, *self.n)] = value


def _heads_of(a, hs: slice):
    """An array broadcastable to (B, H, Lq, Lk), cut to the heads ``hs`` (a view; a broadcast head axis stays)."""
    if a is None:
        return None
    if a.ndim < 4:  # a StructuredMask is 4-D and shared by the heads: it passes as it is
        a = a.reshape((1,) * (4 - a.ndim) + a.shape)  # (b, h, lq, lk), a view
    return a if a.shape[1] == 1 else a[:, hs]


def group_flow(f: Flow, hs: slice, specs: dict, seed) -> Flow:
    """The flow of the heads ``hs`` of the call ``f``: the same inputs, their parameters, mask and dropout draws."""
    H, Hkv = f.H, f.Hkv
    B, _, Lq, Lk = f.args.shape
    rng = None if seed is None else np.random.default_rng((seed, hs.start))  # the same draws in the backward
    args = replace(f.args, shape=(B, hs.stop - hs.start, Lq, Lk), mask=_heads_of(f.args.mask, hs),
                   keep=_heads_of(f.args.keep, hs), rng=rng)  # fmt: skip
    return replace(f, P=GroupParams(f.P, specs, hs, H, Hkv), H=hs.stop - hs.start, Hkv=1, heads=hs, args=args,
                   self_attention=False)  # fmt: skip  # one projection at a time: see GroupGradFlow


def kept_bytes(f: Flow) -> int:
    """The bytes the call ``f`` holds for its backward beyond its inputs, output and gradients, without recompute:
    Q (B, H, Lq, d), K and V (B, Hkv, Lk, d), the context (B, H, Lq, d), each once kept by the forward and once as
    its gradient in the backward (the eight (L, E) arrays measured in docs/performance.md, "Memory"), and the
    (B, H, Lq, Lk) arrays the call's kernel keeps (``Kernel.score_arrays``: 3 vectorized, 0 chunked).
    ``MultiHeadAttention`` compares it with its memory budget (``AttentionConfig.memory_budget``)."""
    B, H, Lq, Lk = f.args.shape
    c = f.owner.config
    d, dv = c.head_dim, c.merged_dim // c.num_heads  # the query/key heads' width, the values' (dv ≠ d in MLA)
    activations = 2 * B * (d + dv) * (H * Lq + f.Hkv * Lk)  # (Q, context) and (K, V), with their gradients
    return c.dtype.itemsize * (activations + f.kernel.score_arrays * B * H * Lq * Lk)


def recompute_forward(steps, f: Flow, specs: dict):
    """The output of the call ``f`` (checked), group by group -> (output (B, Lq, E), RecomputeCache)."""
    cache = RecomputeCache(steps, f, specs, f.args.seed())
    output = None
    for hs in head_groups(f.H, f.Hkv):
        group = group_flow(f, hs, specs, cache.seed)
        forward(steps, group)  # the group's share of the output: merged_g W_o[:, cols_g]ᵀ (+ b_o, first group)
        if output is None:
            output = group.output
        else:
            output += group.output  # (B, Lq, E), summed over the groups
    return output, cache


def recompute_backward(cache: RecomputeCache, d_output: np.ndarray, grads: dict) -> dict:
    """The gradients of the call of ``cache``, group by group; ``grads`` (zeros, by name) receives the parameters'."""
    f, steps = cache.flow, cache.plan
    inputs: dict = {}
    for hs in head_groups(f.H, f.Hkv):
        group, s = group_flow(f, hs, cache.specs, cache.seed), {}
        for step in steps:
            step.recompute(group, s)  # the group's forward again, up to what each backward needs
        g = GroupGradFlow(output=d_output, P=GroupGrads(grads, cache.specs, hs, f.H, f.Hkv), matmul=group.matmul,
                          kernel=group.kernel, attention=group.attention)  # fmt: skip
        g.totals = inputs
        del group  # one group's tensors at a time
        backward(steps, g, s)
        del g, s
    return inputs


class GroupGradFlow(Flow):
    """The backward flow of one head group: the inputs' gradients add into ``totals`` the moment a step makes them
    (every group reads the whole inputs), so only one (B, L, ·) input gradient of a group exists at a time. (A
    group's flow projects query, key and value one by one for the same reason: the fused projection's backward
    makes all three at once.)"""

    def __setattr__(self, name, value):
        if name in ("query", "key", "value") and value is not None:
            totals = self.__dict__["totals"]
            if name in totals:
                totals[name] += value  # in place: the first group's array holds the sum
            else:
                totals[name] = value
            return
        super().__setattr__(name, value)


@dataclass(eq=False)
class RecomputeCache:
    """What the recomputing backward needs: the call's checked flow (its inputs, held by reference, the mask and
    the other arguments; nothing of size L × d), the call's steps (``plan``), the parameters' layouts and the call's
    dropout seed.

    The named intermediates of ``MHACache`` (``Q``, ``K``, ``V``, ``context``, ``attn_weights``, ``scores``,
    ``dropout_mask``, ``attention``) are recomputed when first read, group by group, and joined over the heads.
    """

    plan: tuple
    flow: Flow
    specs: dict
    seed: int | None
    _joined: dict = None

    @property
    def owner(self):
        return self.flow.owner

    def _join(self) -> dict:
        if self._joined is None:
            parts = []
            for hs in head_groups(self.flow.H, self.flow.Hkv):
                group = group_flow(self.flow, hs, self.specs, self.seed)
                forward(self.plan, group)
                parts.append(group)
            self._joined = {
                name: np.concatenate([getattr(p, name) for p in parts], axis=1)  # over the heads
                for name in ("Q", "K", "V", "context")
            }  # (B, H, Lq, d), (B, Hkv, Lk, d) × 2, (B, H, Lq, d)
            self._joined["attention"] = JoinedAttention([p.attention for p in parts])
        return self._joined

    Q = property(lambda self: self._join()["Q"], doc="(B, H, Lq, d), recomputed")
    K = property(lambda self: self._join()["K"], doc="(B, Hkv, Lk, d), recomputed")
    V = property(lambda self: self._join()["V"], doc="(B, Hkv, Lk, d), recomputed")
    context = property(lambda self: self._join()["context"], doc="(B, H, Lq, d), recomputed")
    attention = property(lambda self: self._join()["attention"], doc="the kernel caches of the groups, joined")
    attn_weights = property(lambda self: self.attention.attn_weights, doc="(B, H, Lq, Lk) after softmax")
    scores = property(lambda self: self.attention.scores, doc="(B, H, Lq, Lk) before the mask")
    dropout_mask = property(lambda self: self.attention.dropout_mask, doc="(B, H, Lq, Lk) bool, or None")
    lse = property(lambda self: self.attention.lse, doc="(B, H, Lq) float64 each row's log-sum-exp")


class JoinedAttention:
    """The kernel caches of the head groups as one (the cache contract's arrays, joined over the heads)."""

    def __init__(self, parts: list) -> None:
        self.parts, self.kernel = parts, parts[0].kernel

    def _heads(self, name):
        arrays = [getattr(p, name) for p in self.parts]
        return None if arrays[0] is None else np.concatenate(arrays, axis=1)  # (B, H, Lq, Lk)

    scores = property(lambda self: self._heads("scores"))
    masked_scores = property(lambda self: self._heads("masked_scores"))
    attn_weights = property(lambda self: self._heads("attn_weights"))
    dropout_mask = property(lambda self: self._heads("dropout_mask"))
    lse = property(lambda self: self._heads("lse"))  # (B, H, Lq)


FLOW_FIELDS = tuple(f.name for f in fields(Flow))
