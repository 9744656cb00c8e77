"""Attention maps: ``plot_attention`` (one map per head), ``plot_model_view`` (layers x heads),
``plot_mask`` and ``plot_step`` (any intermediate as a labelled heatmap)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure

from ._layout import (
    DIVERGING_CMAP,
    MASKED_FACE,
    WEIGHT_CMAP,
    annotate_cells,
    as_bhqk,
    blocked_cells,
    check_batch,
    grid_shape,
    mark_blocked,
    needs_rotation,
    panel_grid,
    pick_heads,
    set_ticks,
    tick_labels,
)

# --------------------------------------------------------------------------- attention maps


def plot_attention(
    weights,
    query_tokens: Sequence[str] | None = None,
    key_tokens: Sequence[str] | None = None,
    heads: int | Sequence[int] | None = None,
    *,
    batch: int = 0,
    mask=None,
    title: str | None = None,
    ncols: int | None = None,
    annotate: bool = False,
    panel_size: float = 2.6,
    cmap: str = WEIGHT_CMAP,
    panel_titles: Sequence[str] | None = None,
) -> Figure:
    """One heatmap per head in a grid, sharing one colorbar from 0 to 1.

    weights: (Lq, Lk), (H, Lq, Lk) or (B, H, Lq, Lk) attention weights (rows sum to 1 or are 0);
        for a batch, ``batch`` picks the sequence.
    query_tokens / key_tokens: tick labels of the rows (queries) and columns (keys).
    heads: None = all heads, an int, or a list of head indices.
    mask: optional mask in our convention (bool True = may attend, or float with -inf = blocked),
        broadcastable to (B, H, Lq, Lk). Blocked cells (their weight is exactly 0) are drawn
        grey and hatched, so they never read as "a small weight".
    annotate: write each weight in its cell (for small maps).
    panel_titles: one title per panel shown instead of "head h" (may have several lines), e.g. to
        show heads of different layers side by side.
    Rows are queries ("who looks"), columns are keys ("at whom").
    """
    W = as_bhqk(weights, "weights")
    B, H, Lq, Lk = W.shape
    b = check_batch(batch, B, "weights")
    chosen = pick_heads(H, heads)
    ylab = tick_labels(query_tokens, Lq, "query_tokens")
    xlab = tick_labels(key_tokens, Lk, "key_tokens")
    blocked = None if mask is None else blocked_cells(mask, (B, H, Lq, Lk))[b]
    names = [f"head {h}" for h in chosen] if panel_titles is None else [str(t) for t in panel_titles]
    if len(names) != len(chosen):
        raise ValueError(f"panel_titles has {len(names)} entries but {len(chosen)} heads are shown")

    nrows, ncols = grid_shape(len(chosen), ncols)
    cell = max(0.22, min(0.45, panel_size / max(Lq, Lk)))  # inches per cell, so labels stay readable
    where = f"batch {b}, " if B > 1 else ""
    fig, axes, cax = panel_grid(
        len(chosen),
        ncols,
        Lq,
        Lk,
        cell,
        xlab,
        ylab,
        title=title or f"Attention weights ({where}{len(chosen)} of {H} heads)",
        title_lines=max(t.count("\n") + 1 for t in names),
        masked_key=blocked is not None,
    )
    im = None
    for i, (ax, h) in enumerate(zip(axes, chosen)):
        im = ax.imshow(W[b, h], vmin=0.0, vmax=1.0, cmap=cmap, aspect="equal", interpolation="nearest")
        if blocked is not None:
            mark_blocked(ax, blocked[h])
        if annotate:
            annotate_cells(ax, W[b, h], None if blocked is None else blocked[h], 0.0, 1.0, ".2f")
        first_col = i % ncols == 0
        set_ticks(ax, xlab, ylab, show_y=first_col, rotate=60 if needs_rotation(xlab) else 0)
        ax.set_title(names[i], fontsize=10)
        ax.set_xlabel("key", fontsize=9)
        if first_col:
            ax.set_ylabel("query", fontsize=9)
    cbar = fig.colorbar(im, cax=cax)
    cbar.set_label("attention weight", fontsize=9)
    return fig


def plot_model_view(
    attentions,
    tokens: Sequence[str] | None = None,
    *,
    batch: int = 0,
    layers: Sequence[int] | None = None,
    heads: Sequence[int] | None = None,
    title: str | None = None,
    cell_size: float = 1.15,
    cmap: str = WEIGHT_CMAP,
) -> Figure:
    """A layers × heads grid of small attention maps (like bertviz's model view), colour range 0..1.

    attentions: a sequence with one (B, H, L, L) array per layer (as Hugging Face returns with
        ``output_attentions=True``), or one array (layers, H, L, L), or (layers, B, H, L, L).
    tokens: the L token strings; shown on the left column and the bottom row when L <= 24.
    batch: which sequence of the batch. layers / heads: subsets to show (default all).
    """
    if isinstance(attentions, np.ndarray):
        A = attentions
        if A.ndim == 4:
            A = A[:, None]  # (layers, 1, H, L, L)
            if batch != 0:
                raise ValueError(f"attentions with shape {attentions.shape} has no batch axis; batch must be 0")
    else:
        per_layer = [np.asarray(a) for a in attentions]
        if not per_layer:
            raise ValueError("attentions is empty")
        for i, a in enumerate(per_layer):
            if a.ndim != 4:
                raise ValueError(f"attentions[{i}] must be (B, H, L, L), got shape {a.shape}")
        A = np.stack(per_layer)  # (layers, B, H, L, L)
    if A.ndim != 5 or A.shape[-1] != A.shape[-2]:
        raise ValueError(
            f"attentions must be (layers, H, L, L), (layers, B, H, L, L) or a list of (B, H, L, L), got {A.shape}"
        )
    n_layers, B, H, L, _ = A.shape
    b = check_batch(batch, B, "attentions")
    layer_ids = list(range(n_layers)) if layers is None else [int(i) for i in layers]
    head_ids = pick_heads(H, heads)
    for i in layer_ids:
        if not 0 <= i < n_layers:
            raise ValueError(f"layer {i} out of range: attentions has {n_layers} layers")
    labels = tick_labels(tokens, L, "tokens")

    # A fixed layout in inches (constrained layout is slow with dozens of axes).
    nr, nc = len(layer_ids), len(head_ids)
    gap, right, top = 0.08, 1.0, 0.75
    cell = min(cell_size, (14.0 - 2.0 - gap * (nc - 1)) / nc)  # shrink the cells to fit 14 inches
    show_tokens = L * 0.09 <= cell  # at least ~6.5 pt per token label, else no tick labels
    left, bottom = (1.1, 0.9) if show_tokens else (0.5, 0.2)
    width = left + right + nc * cell + (nc - 1) * gap
    height = bottom + top + nr * cell + (nr - 1) * gap
    fig = Figure(figsize=(width, height))
    axs = fig.subplots(
        nr,
        nc,
        squeeze=False,
        gridspec_kw=dict(
            left=left / width,
            right=1 - right / width,
            bottom=bottom / height,
            top=1 - top / height,
            wspace=gap / cell,
            hspace=gap / cell,
        ),
    )
    im = None
    for r, layer in enumerate(layer_ids):
        for c, h in enumerate(head_ids):
            ax = axs[r, c]
            im = ax.imshow(A[layer, b, h], vmin=0.0, vmax=1.0, cmap=cmap, interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
            if show_tokens and r == nr - 1:
                ax.set_xticks(range(L), labels, rotation=90, fontsize=6)
            if show_tokens and c == 0:
                ax.set_yticks(range(L), labels, fontsize=6)
            ax.tick_params(length=1.5, pad=1)
            if r == 0:
                ax.set_title(f"head {h}", fontsize=9)
            if c == 0:
                ax.set_ylabel(f"layer {layer}", fontsize=9)
    cax = fig.add_axes((1 - (right - 0.2) / width, bottom / height, 0.14 / width, nr * cell / height * 0.98))
    cbar = fig.colorbar(im, cax=cax)
    cbar.set_label("attention weight", fontsize=9)
    fig.suptitle(title or "Attention of every layer and head (rows: queries, columns: keys)", fontsize=11)
    return fig


# --------------------------------------------------------------------------- masks


def plot_mask(
    mask,
    query_tokens: Sequence[str] | None = None,
    key_tokens: Sequence[str] | Sequence[Sequence[str]] | None = None,
    *,
    batch: int | None = None,
    head: int = 0,
    Lq: int | None = None,
    title: str | None = None,
) -> Figure:
    """A mask as a picture: which query (row) may attend to which key (column).

    mask: bool (True = may attend) or float (added to the scores, -inf = blocked), any shape that
        broadcasts to (B, H, Lq, Lk): (Lq, Lk), (B, 1, 1, Lk) padding masks, (B, H, Lq, Lk), ...
    Lq: the number of queries, to draw a (B, 1, 1, Lk) key padding mask as full rows
        (default: len(query_tokens), else 1).
    batch: None = one panel per sequence of the batch, or an int for one sequence.
    head: which head, when the mask differs per head.
    key_tokens: one list of tokens, or one list per sequence (padded batches have different tokens).
    A bool mask is drawn in two colours (may attend / blocked hatched grey); a float mask with its
    added values on a diverging scale, -inf cells hatched grey.
    """
    m = np.asarray(mask)
    if m.ndim < 2 or m.ndim > 4:
        raise ValueError(f"mask must have 2 to 4 dimensions (broadcastable to (B, H, Lq, Lk)), got shape {m.shape}")
    if m.dtype != np.bool_ and not np.issubdtype(m.dtype, np.floating):
        raise ValueError(f"mask must be bool (True = may attend) or float (added), got dtype {m.dtype} shape {m.shape}")
    m = m.reshape((1,) * (4 - m.ndim) + m.shape)  # (B, H, Lq, Lk) up to broadcasting
    Lq = Lq if Lq is not None else (len(query_tokens) if query_tokens is not None else m.shape[2])
    if m.shape[2] not in (1, Lq):
        raise ValueError(f"mask with shape {np.shape(mask)} does not match Lq={Lq}")
    m = np.broadcast_to(m, (m.shape[0], m.shape[1], Lq, m.shape[3]))
    B, Hm, _, Lk = m.shape
    if not 0 <= head < Hm and Hm != 1:
        raise ValueError(f"head={head} out of range for a mask with {Hm} heads")
    m = m[:, head if Hm > 1 else 0]  # (B, Lq, Lk)
    batches = list(range(B)) if batch is None else [check_batch(batch, B, "mask")]
    ylab = tick_labels(query_tokens, Lq, "query_tokens")
    per_seq = key_tokens is not None and len(key_tokens) > 0 and not isinstance(key_tokens[0], str)
    if per_seq and len(key_tokens) != B:
        raise ValueError(f"key_tokens has {len(key_tokens)} lists but the mask has batch size {B}")

    is_bool = m.dtype == np.bool_
    n = len(batches)
    nrows, ncols = grid_shape(n, None)
    cell = max(0.22, min(0.42, 2.6 / max(Lq, Lk)))
    xlabs = [tick_labels(key_tokens[bb] if per_seq else key_tokens, Lk, "key_tokens") for bb in batches]
    any_neginf = not is_bool and bool(np.isneginf(m[batches]).any())
    kind = "bool, True = may attend" if is_bool else "float, added to scores"
    fig, axes, cax = panel_grid(
        n,
        ncols,
        Lq,
        Lk,
        cell,
        max(xlabs, key=lambda labs: max(len(t) for t in labs)),
        ylab,
        title=title or f"Mask {tuple(np.shape(mask))} ({kind})",
        title_lines=int(B > 1),
        masked_key=any_neginf,
    )
    im = None
    finite = m[np.isfinite(m)] if not is_bool else None
    vmax = float(np.abs(finite).max()) if finite is not None and finite.size else 1.0
    vmax = vmax if vmax > 0 else 1.0
    for i, (ax, bb) in enumerate(zip(axes, batches)):
        blocked = ~m[bb] if is_bool else np.isneginf(m[bb])
        if is_bool:
            cmap = ListedColormap([MASKED_FACE, "#2a788e"])
            im = ax.imshow(m[bb].astype(float), vmin=0, vmax=1, cmap=cmap, interpolation="nearest")
        else:
            shown = np.where(np.isfinite(m[bb]), m[bb], np.nan)
            im = ax.imshow(shown, vmin=-vmax, vmax=vmax, cmap=DIVERGING_CMAP, interpolation="nearest")
        mark_blocked(ax, blocked)
        ax.set_xticks(np.arange(-0.5, Lk), minor=True)  # thin white lines between the cells
        ax.set_yticks(np.arange(-0.5, Lq), minor=True)
        ax.grid(which="minor", color="white", linewidth=0.6)
        ax.tick_params(which="minor", length=0)
        set_ticks(ax, xlabs[i], ylab, show_y=i % ncols == 0, rotate=60 if needs_rotation(xlabs[i]) else 0)
        ax.set_xlabel("key", fontsize=9)
        if i % ncols == 0:
            ax.set_ylabel("query", fontsize=9)
        if B > 1:
            ax.set_title(f"sequence {bb}", fontsize=10)
    if is_bool:
        cbar = fig.colorbar(im, cax=cax, ticks=[0.25, 0.75])
        cbar.ax.set_yticklabels(["blocked\n(False)", "may\nattend\n(True)"], fontsize=8)
    else:
        cbar = fig.colorbar(im, cax=cax)
        cbar.set_label("added to the scores", fontsize=9)
    return fig


# --------------------------------------------------------------------------- any intermediate


def plot_step(
    array,
    title: str,
    *,
    batch: int = 0,
    row_tokens: Sequence[str] | None = None,
    col_tokens: Sequence[str] | None = None,
    xlabel: str | None = None,
    ylabel: str | None = None,
    heads: int | Sequence[int] | None = None,
    cmap: str | None = None,
    vmin: float | None = None,
    vmax: float | None = None,
    annotate: bool = False,
    colorbar_label: str = "value",
) -> Figure:
    """Any intermediate as a labelled heatmap, with its full shape in the title.

    array: 1-D (N,), 2-D (rows, cols), 3-D (B, L, E) (``batch`` picks the sequence), or 4-D
        (B, H, L, d) or (B, H, Lq, Lk) (``batch`` picks the sequence; the heads side by side).
    row_tokens / col_tokens: tick labels of rows and columns (e.g. the tokens of a sequence).
    Colours: a diverging map centred on 0 when the array has negative entries, else viridis from 0;
        ``cmap`` / ``vmin`` / ``vmax`` override. ``-inf`` cells (masked scores) are hatched grey.
    """
    a = np.asarray(array)
    shape = a.shape
    if a.ndim == 1:
        a = a[None, :]
    if a.ndim not in (2, 3, 4):
        raise ValueError(f"plot_step needs a 1-D to 4-D array, got shape {shape}")
    if a.ndim == 2:
        panels = [a]
        names = [None]
        default_x, default_y = "column", "row"
        where = ""
    elif a.ndim == 3:
        b = check_batch(batch, a.shape[0], "array")
        panels, names = [a[b]], [None]
        default_x, default_y = "feature", "position"
        where = f", batch {b}" if a.shape[0] > 1 else ""
    else:
        b = check_batch(batch, a.shape[0], "array")
        chosen = pick_heads(a.shape[1], heads)
        panels = [a[b, h] for h in chosen]
        names = [f"head {h}" for h in chosen]
        default_x, default_y = "feature within the head", "position"
        where = f", batch {b}" if a.shape[0] > 1 else ""

    stacked = np.stack(panels).astype(np.float64)
    finite = stacked[np.isfinite(stacked)]
    lo = float(finite.min()) if finite.size else 0.0
    hi = float(finite.max()) if finite.size else 1.0
    if cmap is None:
        cmap = DIVERGING_CMAP if lo < 0 else WEIGHT_CMAP
    if vmin is None and vmax is None and lo < 0:
        big = max(abs(lo), abs(hi)) or 1.0
        vmin, vmax = -big, big
    vmin = (0.0 if lo >= 0 else lo) if vmin is None else vmin
    vmax = (hi if hi > vmin else vmin + 1.0) if vmax is None else vmax

    rows, cols = stacked.shape[1:]
    ylab = tick_labels(row_tokens, rows, "row_tokens")
    xlab = tick_labels(col_tokens, cols, "col_tokens")
    n = len(panels)
    nrows, ncols = grid_shape(n, None)
    cell = max(0.16, min(0.42, 3.2 / max(rows, cols)))
    dense_x, dense_y = cols > 24 and col_tokens is None, rows > 24 and row_tokens is None
    any_blocked = bool(np.isneginf(stacked).any())
    fig, axes, cax = panel_grid(
        n,
        ncols,
        rows,
        cols,
        cell,
        [] if dense_x else xlab,
        [] if dense_y else ylab,
        title=f"{title}  shape {shape}{where}",
        title_lines=int(any(names)),
        masked_key=any_blocked,
    )
    im = None
    for i, (ax, p, name) in enumerate(zip(axes, stacked, names)):
        shown = np.where(np.isfinite(p), p, np.nan)
        im = ax.imshow(shown, vmin=vmin, vmax=vmax, cmap=cmap, interpolation="nearest", aspect="equal")
        blocked = np.isneginf(p)
        if blocked.any():
            mark_blocked(ax, blocked)
        if annotate:
            annotate_cells(ax, p, blocked, vmin, vmax, ".2f")
        set_ticks(ax, xlab, ylab, show_y=i % ncols == 0, rotate=60 if needs_rotation(xlab) else 0)
        if dense_x:
            ax.set_xticks([])
        if dense_y:
            ax.set_yticks([])
        if name:
            ax.set_title(name, fontsize=10)
        ax.set_xlabel(xlabel or default_x, fontsize=9)
        if i % ncols == 0:
            ax.set_ylabel(ylabel or default_y, fontsize=9)
    cbar = fig.colorbar(im, cax=cax)
    cbar.set_label(colorbar_label, fontsize=9)
    return fig
