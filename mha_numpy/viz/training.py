"""Pictures of ``mha_numpy.train``: the loss and accuracy curves and the attention during training."""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from ._layout import WEIGHT_CMAP


def plot_training_history(history: dict, title: str | None = None) -> Figure:
    """Loss (log scale) and token accuracy against the training step, side by side.

    history: a dict with equal-length lists "step", "loss" and "accuracy" (as ``mha_numpy.train``
    records them: each value measured on that step's batch, before the update).
    """
    for key in ("step", "loss", "accuracy"):
        if key not in history:
            raise ValueError(f"history needs the key {key!r}, got keys {sorted(history)}")
    step = np.asarray(history["step"])
    loss = np.asarray(history["loss"], dtype=np.float64)
    acc = np.asarray(history["accuracy"], dtype=np.float64)
    fig = Figure(figsize=(9.0, 3.2), layout="constrained")
    ax_loss, ax_acc = fig.subplots(1, 2)
    ax_loss.plot(step, np.maximum(loss, 1e-12), color="#1f77b4", lw=1.2)
    ax_loss.set_yscale("log")
    ax_loss.set_xlabel("step")
    ax_loss.set_ylabel("cross-entropy loss (log scale)")
    ax_loss.set_title(f"loss: {loss[0]:.3g} at step {step[0]}, {loss[-1]:.2g} at step {step[-1]}", fontsize=10)
    ax_acc.plot(step, acc, color="#2ca02c", lw=1.2)
    ax_acc.axhline(1.0, color="0.6", lw=0.8, ls="--")
    ax_acc.set_ylim(0.0, 1.05)
    ax_acc.set_xlabel("step")
    ax_acc.set_ylabel("token accuracy (batch)")
    ax_acc.set_title(f"accuracy: {acc[-1]:.3f} at step {step[-1]}", fontsize=10)
    for ax in (ax_loss, ax_acc):
        ax.grid(alpha=0.3)
    fig.suptitle(title or "Training", fontsize=11)
    return fig


def _position_ticks(ax, Lq: int, Lk: int, show_y: bool) -> None:
    """Position indices as ticks on short sequences, none on long ones (they would overlap)."""
    ax.set_xticks(range(Lk) if Lk <= 12 else [])
    ax.set_yticks(range(Lq) if Lq <= 12 else [])
    ax.tick_params(labelsize=7, length=2, labelleft=show_y)


def plot_attention_over_training(
    snapshots: dict,
    ideal: np.ndarray | None = None,
    title: str | None = None,
    panel_size: float = 1.9,
) -> Figure:
    """Attention maps at a few moments of training (columns), one row per head, the ideal map last.

    snapshots: {step: (H, Lq, Lk) weights} (e.g. averaged over a batch); one snapshot gives the
        "learned next to ideal" picture.
    ideal: optional (Lq, Lk) 0/1 map of where each query should look; each panel's title then says
        which share of the attention mass lands on it (1 = exactly the ideal pattern).
    """
    if not snapshots:
        raise ValueError("snapshots is empty: give at least one {step: (H, Lq, Lk) weights}")
    steps = sorted(snapshots)
    maps = [np.asarray(snapshots[s]) for s in steps]
    if any(m.ndim != 3 or m.shape != maps[0].shape for m in maps):
        raise ValueError(f"every snapshot must have the same (H, Lq, Lk) shape, got {[m.shape for m in maps]}")
    H, Lq, Lk = maps[0].shape
    if ideal is not None and np.shape(ideal) != (Lq, Lk):
        raise ValueError(f"ideal with shape {np.shape(ideal)} must be (Lq, Lk) = {(Lq, Lk)}")
    ncols = len(steps) + (ideal is not None)
    # per panel: the map plus room for its two-line title and tick labels
    fig = Figure(figsize=(panel_size * ncols + 1.2, (panel_size + 0.45) * H + 0.6), layout="constrained")
    axs = fig.subplots(H, ncols, squeeze=False)
    im = None
    for h in range(H):
        for c, (s, m) in enumerate(zip(steps, maps)):
            ax = axs[h, c]
            im = ax.imshow(m[h], vmin=0.0, vmax=1.0, cmap=WEIGHT_CMAP, interpolation="nearest")
            label = f"step {s}"
            if ideal is not None:
                share = float((m[h] * ideal).sum(axis=-1).mean())  # mass on the ideal keys, mean over queries
                label += f"\non ideal: {share:.0%}"
            ax.set_title(label if h == 0 or ideal is not None else "", fontsize=9)
            _position_ticks(ax, Lq, Lk, show_y=c == 0)
            if c == 0:
                ax.set_ylabel(f"head {h}\nquery", fontsize=9)
            if h == H - 1:
                ax.set_xlabel("key", fontsize=9)
        if ideal is not None:
            ax = axs[h, -1]
            ax.imshow(ideal, vmin=0.0, vmax=1.0, cmap=WEIGHT_CMAP, interpolation="nearest")
            ax.set_title("ideal" if h == 0 else "", fontsize=9, fontweight="bold")
            _position_ticks(ax, Lq, Lk, show_y=False)
            if h == H - 1:
                ax.set_xlabel("key", fontsize=9)
    cbar = fig.colorbar(im, ax=axs, shrink=0.9, aspect=25)
    cbar.set_label("attention weight", fontsize=9)
    fig.suptitle(title or "Attention during training (rows: queries, columns: keys)", fontsize=11)
    return fig
