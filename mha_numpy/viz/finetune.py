"""Figures of fine-tuning: which head changed most, and its attention before vs after."""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure


def most_changed_head(before: np.ndarray, after: np.ndarray, key: int) -> tuple[int, int, float, float]:
    """before, after: (layers, H, L, L); key: the key word's position. -> (layer, head, mass before, mass after)
    for the head whose attention mass on the key word (mean over queries) grew most."""
    mass_before, mass_after = before[..., key].mean(-1), after[..., key].mean(-1)  # (layers, H)
    layer, head = np.unravel_index(np.argmax(mass_after - mass_before), mass_before.shape)
    return int(layer), int(head), float(mass_before[layer, head]), float(mass_after[layer, head])


def plot_attention_before_after(before: np.ndarray, after: np.ndarray, tokens: list[str], word: str) -> Figure:
    """Two heatmaps (queries down, keys across) of the head whose attention to ``word`` grew most."""
    key = tokens.index(word)
    layer, head, m0, m1 = most_changed_head(before, after, key)
    fig = Figure(figsize=(10.0, 4.6), layout="constrained")
    axes = fig.subplots(1, 2)
    for ax, weights, what, mass in ((axes[0], before, "before", m0), (axes[1], after, "after", m1)):
        im = ax.imshow(weights[layer, head], cmap="viridis", vmin=0.0, vmax=1.0)
        ax.set_xticks(range(len(tokens)), tokens, rotation=60, ha="right", fontsize=8)
        ax.set_yticks(range(len(tokens)), tokens, fontsize=8)
        ax.get_xticklabels()[key].set_color("#d62728")
        ax.set_title(f"{what} fine-tuning: {mass:.0%} of the attention on '{word}'", fontsize=10)
    fig.colorbar(im, ax=axes, shrink=0.8, label="attention weight")
    fig.suptitle(f"layer {layer}, head {head}: the head whose attention to the key word grew most", fontsize=11)
    return fig
