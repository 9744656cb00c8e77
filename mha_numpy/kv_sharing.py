"""Cross-layer KV sharing (Gemma 3n): later layers read the K and V of an earlier one, so those K and V have more
than one reader and their gradient is the sum over the readers.

Layer j's source is ``sources[j]``: j itself (it makes its own K and V), or an earlier layer i < j that makes its
own (no chains). A layer that is read is a ``MultiHeadAttention(kv_sharing="store")``, a reader one with
``kv_sharing="reuse"`` (no key or value projection, norm or RoPE of its own: its key and value are its source's K
and V, ``MHACache.K``, ``.V``, (B, Hkv, Lk, d)). The backward walks the layers in reverse: each reader's
``grads["key"]``, ``grads["value"]`` are added up per source and given to the source's backward
(``backward(..., d_shared_kv=(dK, dV))``), where they join its own gradient of K and V before its RoPE and norms.

    sources = check_kv_sources([0, 1, 1, 0])             # layers 2 and 3 read layers 1 and 0
    outputs, caches = shared_kv_forward(layers, inputs, sources, masks)
    grads = shared_kv_backward(layers, d_outputs, caches, sources)

Here the layers' inputs are given (a stack of attentions alone, as the cross-checks use it); in a model each
layer's input is the previous layer's output and the same two walks run inside its forward and backward.
"""

from __future__ import annotations

import numpy as np


def check_kv_sources(sources) -> list[int]:
    """sources (one int per layer) checked: sources[j] in [0, j], and a layer read by another makes its own K and
    V (sources[sources[j]] == sources[j]). ValueError naming sources[j] otherwise (an index that points forward,
    past the layers, or to a layer that itself reads another's)."""
    out = []
    for j, i in enumerate(sources):
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)) or not 0 <= i <= j:
            raise ValueError(f"sources[{j}] must be an int in [0, {j}] (layer {j} or an earlier one: K and V are "
                             f"shared forwards, never backwards), got {i!r}")  # fmt: skip
        if out[i : i + 1] and out[i] != i:
            raise ValueError(f"sources[{j}] = {i} points to layer {i}, which reads layer {out[i]}'s K and V itself; "
                             f"point to layer {out[i]}")  # fmt: skip
        out.append(int(i))
    return out


def _check_modes(layers, sources) -> None:
    """Each layer's kv_sharing fits its place: "reuse" where it reads another's, "store" where it is read."""
    read = {i for j, i in enumerate(sources) if i != j}
    for j, (layer, i) in enumerate(zip(layers, sources)):
        expected = "reuse" if i != j else ("store" if j in read else None)
        if layer.config.kv_sharing != expected:
            raise ValueError(f"layers[{j}] has kv_sharing={layer.config.kv_sharing!r}; with sources[{j}] = {i} it "
                             f"must be {expected!r}")  # fmt: skip


def shared_kv_forward(layers, inputs, sources, masks=None) -> tuple[list, list]:
    """Each layer's self-attention on its input (B, L, E), in order, a reader on its source's K and V.

    layers: ``MultiHeadAttention``s; inputs, masks (None: no mask): one per layer; sources: ``check_kv_sources``'s.
    -> (outputs, caches), one per layer. ValueError naming the argument when the lists differ in length or a
    layer's kv_sharing does not fit its source."""
    sources = check_kv_sources(sources)
    masks = [None] * len(layers) if masks is None else list(masks)
    if not len(layers) == len(inputs) == len(sources) == len(masks):
        raise ValueError(f"layers, inputs, sources and masks must have one entry per layer, got {len(layers)}, "
                         f"{len(inputs)}, {len(sources)}, {len(masks)}")  # fmt: skip
    _check_modes(layers, sources)
    outputs, caches = [], []
    for j, (layer, x, i, mask) in enumerate(zip(layers, inputs, sources, masks)):
        kv = (caches[i].K, caches[i].V) if i != j else (x, x)  # a reader: its source's K, V (B, Hkv, Lk, d)
        out, cache = layer.forward(x, *kv, mask=mask)
        outputs.append(out)
        caches.append(cache)
    return outputs, caches


def shared_kv_backward(layers, d_outputs, caches, sources) -> list[dict]:
    """The layers' backwards in reverse: a reader's gradients of its key and value summed per source and given to
    the source's backward (``d_shared_kv``). -> one dict of gradients per layer; a reader's "key" and "value" are
    the gradients of its source's K and V, which the source's gradients already include."""
    sources = check_kv_sources(sources)
    shared: dict[int, list] = {}
    grads: list = [None] * len(layers)
    for j in reversed(range(len(layers))):
        i, d_kv = sources[j], shared.get(j)
        grads[j] = layers[j].backward(d_outputs[j], caches[j], d_shared_kv=None if d_kv is None else tuple(d_kv))
        if i != j:  # the readers of layer i add up: K and V have more than one reader
            d_k, d_v = grads[j]["key"], grads[j]["value"]
            shared[i] = [d_k, d_v] if i not in shared else [shared[i][0] + d_k, shared[i][1] + d_v]
    return grads
